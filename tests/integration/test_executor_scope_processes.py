"""Executor scope end to end: real pools never run another tenant's run.

One control plane process, two executor pools (two processes each) whose
credentials serve disjoint halves of 10 workspaces, 1,000 runs started with
each workspace's own key. Every run completes, and the executors' own logs
(one `claimed run <id> of workspace <ws>` line per assignment) show each run
claimed only by processes of the pool whose scope holds its workspace. A run
of an 11th workspace, which no pool serves, stays queued throughout.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import defaultdict

import pytest

from agentrun.v1 import run_pb2
from control_plane.deploys.canary import CANARY_WORKSPACE
from tests.harness import auth
from tests.harness.agentrun_api import Api
from tests.harness.processes import ManagedProcess
from tests.harness.waiting import eventually

WORKSPACES = [f"ws-{i}" for i in range(10)]
SCOPES = {"pool-a": WORKSPACES[:5], "pool-b": WORKSPACES[5:]}
UNSERVED = "ws-unserved"
RUNS_PER_WORKSPACE = 100
BATCH = 50  # StartRun calls in flight at once, per workspace
CLAIMED = re.compile(r"claimed run (\S+) of workspace (\S+) ")


@pytest.fixture
async def apis(db_url, control_plane):
    """The control plane and, per workspace (served or not), an Api with that workspace's
    own key and an echo agent published."""
    cp = control_plane(db_url)
    apis = {}
    for ws in [*WORKSPACES, UNSERVED]:
        apis[ws] = Api(cp.address, ws, await auth.workspace_key(db_url, ws), db_url)
        await apis[ws].publish("echo", "echo_input", ["echo"])
    yield cp, apis
    for api in apis.values():
        await api.close()


async def start_runs(api: Api, count: int) -> list[str]:
    ids: list[str] = []
    for first in range(0, count, BATCH):
        texts = [f"{api.ws} run {n}" for n in range(first, min(first + BATCH, count))]
        ids += await asyncio.gather(*(api.start("echo", text) for text in texts))
    return ids


async def runs_with(api: Api, status: int) -> list[run_pb2.Run]:
    found: list[run_pb2.Run] = []
    token = ""
    while True:
        resp = await api.runs.ListRuns(
            run_pb2.ListRunsRequest(
                workspace_id=api.ws, page_size=500, page_token=token, status=status
            )
        )
        found += resp.runs
        if not (token := resp.next_page_token):
            return found


def claims(pool: list[ManagedProcess]) -> list[tuple[str, str]]:
    """(run id, workspace) of every assignment the pool's processes logged."""
    return [m.groups() for p in pool for m in CLAIMED.finditer(p.log_path.read_text())]


async def start_pools(cp, db_url: str, executor_factory) -> dict[str, list[ManagedProcess]]:
    """Two executor processes per pool, each pool with a credential serving its scope."""
    pools = {}
    for name, scope in SCOPES.items():
        key = await auth.executor_key(db_url, scope=scope, principal=name)
        pools[name] = executor_factory(cp, count=2, AGENTRUN_CAPACITY=16, AGENTRUN_EXECUTOR_KEY=key)
    return pools


def claimed_by(pools: dict[str, list[ManagedProcess]], workspace_of: dict[str, str]):
    """Run id -> the pools whose processes logged its assignment, checking every logged
    assignment against the pool's scope and the run's real workspace."""
    pools_of: dict[str, set[str]] = defaultdict(set)
    for name, pool in pools.items():
        for run_id, ws in claims(pool):
            if ws == CANARY_WORKSPACE:  # every executor may run the release's canary
                continue
            assert ws in SCOPES[name], f"{name} was assigned run {run_id} of {ws}"
            assert workspace_of.get(run_id) == ws, f"run {run_id} is not one of {ws}'s runs"
            pools_of[run_id].add(name)
    return pools_of


async def test_two_scoped_pools_of_real_executors_never_run_outside_their_scope(
    apis, db_url, executor_factory
):
    cp, api = apis
    unserved = await api[UNSERVED].start("echo", "nobody serves me")
    pools = await start_pools(cp, db_url, executor_factory)
    started = time.monotonic()
    per_ws = await asyncio.gather(*(start_runs(api[ws], RUNS_PER_WORKSPACE) for ws in WORKSPACES))
    workspace_of = {run: ws for ws, ids in zip(WORKSPACES, per_ws, strict=True) for run in ids}
    assert len(workspace_of) == len(WORKSPACES) * RUNS_PER_WORKSPACE

    async def all_completed() -> bool:
        done = await asyncio.gather(
            *(runs_with(api[ws], run_pb2.RUN_STATUS_COMPLETED) for ws in WORKSPACES)
        )
        return sum(map(len, done)) == len(workspace_of)

    await eventually(all_completed, timeout=240, interval=1, message="not every run completed")
    print(
        f"\n{len(workspace_of)} runs over {len(WORKSPACES)} workspaces completed in "
        f"{time.monotonic() - started:.1f}s"
    )

    # The executors' own record: which process was handed which run, of which workspace.
    pools_of = claimed_by(pools, workspace_of)
    assert set(pools_of) == set(workspace_of)  # every run was claimed by a pool...
    assert all(len(names) == 1 for names in pools_of.values())  # ...by one pool only
    assert unserved not in pools_of
    (queued,) = await runs_with(api[UNSERVED], run_pb2.RUN_STATUS_QUEUED)
    assert queued.run_id == unserved and queued.lease_owner == ""
