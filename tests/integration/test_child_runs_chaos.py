"""Child runs under kill -9 at random moments, with real processes: parents with three
children each, several executors; the test SIGKILLs the executor holding a parent and the
one holding a child wherever their runs happen to be (a model call in flight, a commit, a
send), and replaces them. Each child's outcome reaches its parent exactly once, every child
sends its one mail once (the provider's log), no committed decision is asked again, and
nothing is lost: every parent completes with all three outcomes.

The seed is printed; AGENTRUN_CHILD_CHAOS_SEED replays a run's choices (the moments still
depend on timing)."""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid

import asyncpg
import pytest

from agentrun.v1 import run_pb2
from tests.harness import auth
from tests.harness.agentrun_api import Api, sandbox_effects, sandbox_requests
from tests.harness.invariants import (
    assert_log_well_formed,
    assert_no_reask,
    assert_writes_at_most_once,
)
from tests.harness.waiting import eventually
from tests.integration.test_child_runs import children_of
from tests.integration.test_signals import cli

FAMILIES = 2
KILLS = {"parent": 2, "child": 2}  # SIGKILLs of a holder of each kind, at least one each
FLEET = 3


@pytest.fixture
async def stack(db_url, control_plane, sandbox_model, sandbox_providers):
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url)
    await api.publish("kid", "kid_mail", ["send_email"])
    await api.publish("parent", "parent3_slow", ["start_child"])
    db = await asyncpg.connect(db_url)
    yield cp, api, db
    await db.close()
    await api.close()


async def holders(db: asyncpg.Connection) -> list[tuple[str, str]]:
    """(executor id, parent|child) of every run held right now."""
    rows = await db.fetch(
        "SELECT lease_owner, parent_run_id IS NULL AS top FROM runs"
        " WHERE workspace_id = 'ws' AND status = 'running' AND lease_owner IS NOT NULL"
    )
    return [(r["lease_owner"], "parent" if r["top"] else "child") for r in rows]


class Chaos:
    """Kills the holder of a parent or a child at random moments and keeps the fleet full."""

    def __init__(self, spawn, rng: random.Random) -> None:
        self.spawn = spawn
        self.rng = rng
        self.fleet = {p.name: p for p in (spawn() for _ in range(FLEET))}
        self.left = dict(KILLS)
        self.killed: list[tuple[str, str]] = []

    async def step(self, db: asyncpg.Connection) -> None:
        held = [(owner, kind) for owner, kind in await holders(db) if self.left[kind] > 0]
        if held and self.rng.random() < 0.5:
            owner, kind = self.rng.choice(held)
            # Somewhere inside the hold: the model's answer, a commit or a send in flight.
            await asyncio.sleep(self.rng.uniform(0, 0.25))
            proc = self.fleet.pop(owner, None)
            if proc is not None and proc.alive:
                proc.kill()
                self.left[kind] -= 1
                self.killed.append((owner, kind))
                new = self.spawn()
                self.fleet[new.name] = new


async def check_family(api: Api, db_url: str, parent_id: str, model_log, provider_log) -> None:
    steps = await api.steps(parent_id)
    assert_log_well_formed(steps)
    assert_no_reask(parent_id, steps, model_log)
    started = [s for s in steps if s.kind == "tool_started" and s.payload["tool"] == "start_child"]
    results = [s for s in steps if s.kind == "tool_result" and s.payload["tool"] == "start_child"]
    kids = await children_of(db_url, parent_id)
    # One child per call, one result per call, each naming its own child.
    assert [k["input"] for k in kids] == ["one", "two", "three"]
    # Visible both ways: GetRun lists a parent's children and names a child's parent.
    assert list((await api.get(parent_id)).child_run_ids) == [str(k["run_id"]) for k in kids]
    assert [k["parent_seq"] for k in kids] == [s.seq for s in started]
    assert sorted(r.ref_seq for r in results) == [s.seq for s in started]
    for kid, result in zip(kids, sorted(results, key=lambda r: r.ref_seq), strict=True):
        kid_id = str(kid["run_id"])
        assert kid["status"] == "completed"
        assert result.payload["status"] == "ok"
        assert result.payload["output"]["child_run_id"] == kid_id
        assert result.payload["output"]["output"] == kid["output"]
        kid_run = await api.get(kid_id)
        assert (kid_run.parent_run_id, kid_run.parent_seq) == (parent_id, result.ref_seq)
        assert list(kid_run.child_run_ids) == []
        kid_steps = await api.steps(kid_id)
        assert_log_well_formed(kid_steps)
        assert_no_reask(kid_id, kid_steps, model_log)
        # The child's one mail: sent at most once, and it happened exactly once.
        mine = [r for r in provider_log if (r["idempotency_key"] or "").startswith(kid_id)]
        assert len(assert_writes_at_most_once(mine, "/mail/send")) == 1


async def test_kill_9_of_parents_and_childrens_executors_at_random_moments(
    stack, executor_factory, db_url, sandbox_model, sandbox_providers
):
    cp, api, db = stack
    seed = int(os.environ.get("AGENTRUN_CHILD_CHAOS_SEED") or random.randrange(10**6))
    print(f"child chaos seed {seed}")
    chaos = Chaos(lambda: executor_factory(cp)[0], random.Random(seed))
    parent_ids = [await api.start("parent", f"family {i}") for i in range(FAMILIES)]
    deadline = time.monotonic() + 50
    while time.monotonic() < deadline:
        runs = [await api.get(r) for r in parent_ids]
        if all(r.status == run_pb2.RUN_STATUS_COMPLETED for r in runs):
            break
        assert not any(
            r.status in (run_pb2.RUN_STATUS_FAILED, run_pb2.RUN_STATUS_CANCELLED) for r in runs
        ), [r.error for r in runs]
        await chaos.step(db)
        await asyncio.sleep(0.05)  # a polling interval, not a synchronisation
    runs = await api.wait_terminal(parent_ids, within=30)
    assert all(r.status == run_pb2.RUN_STATUS_COMPLETED for r in runs), [r.error for r in runs]
    kinds = {kind for _, kind in chaos.killed}
    print(f"child chaos: killed {chaos.killed}")
    assert kinds == {"parent", "child"}, f"a parent's and a child's executor must die: {kinds}"
    model_log = sandbox_requests(sandbox_model.url)
    provider_log = sandbox_requests(sandbox_providers.url)
    for parent_id in parent_ids:
        await check_family(api, db_url, parent_id, model_log, provider_log)
    kid_ids = {str(k["run_id"]) for p in parent_ids for k in await children_of(db_url, p)}
    mails = [
        e
        for e in sandbox_effects(sandbox_providers.url, "mail")
        if (e.get("key") or "").split(":")[0] in kid_ids
    ]
    assert len(mails) == len(kid_ids) == 3 * FAMILIES
    # And through the CLI: `runs show` names a parent's children and a child's parent.
    key = await auth.workspace_key(db_url, "ws", role="reader")
    a_kid = sorted(kid_ids)[0]
    shown = await cli(cp.address, key, "runs", "show", parent_ids[0])
    assert shown.returncode == 0 and "children" in shown.stdout, shown.stderr
    kid_shown = await cli(cp.address, key, "runs", "show", a_kid)
    assert "parent" in kid_shown.stdout and "start_child at step" in kid_shown.stdout


async def test_kill_9_of_executors_and_the_control_plane_during_a_fan_in(
    stack, executor_factory, db_url, sandbox_model, sandbox_providers
):
    """Twenty children of one start_children call (each sends one mail); while they end,
    kill -9 an executor holding children, then the control plane (restarted on its port),
    then another executor. The parent's log holds the call's one result, every child's
    outcome in it once and in list order; every child completed and mailed once."""
    cp, api, db = stack
    await api.publish("fanner", "fan20", ["start_children"])
    parent_id = await api.start("fanner", "go")
    fleet = executor_factory(cp, count=2)

    async def ended(n: int) -> bool:
        return (
            await db.fetchval(
                "SELECT count(*) FROM runs WHERE workspace_id = 'ws' AND parent_run_id = $1"
                " AND status = 'completed'",
                uuid.UUID(parent_id),
            )
            >= n
        )

    async def holding_a_child() -> str | None:
        return await db.fetchval(
            "SELECT lease_owner FROM runs WHERE workspace_id = 'ws' AND parent_run_id = $1"
            " AND status = 'running' LIMIT 1",
            uuid.UUID(parent_id),
        )

    async def kill_a_childs_holder() -> None:
        await eventually(holding_a_child, timeout=30, message="no child held")
        owner = await holding_a_child()
        victim = next((p for p in fleet if p.name == owner and p.alive), None)
        victim = victim or next(p for p in fleet if p.alive)
        victim.kill()
        fleet.extend(executor_factory(cp))

    await eventually(lambda: ended(3), timeout=60, message="no child ended")
    await kill_a_childs_holder()
    await eventually(lambda: ended(8), timeout=60, message="the fan-in stalled")
    cp.kill()  # mid fan-in: children ending, the parent still parked
    cp.restart()
    await eventually(lambda: ended(12), timeout=60, message="no child ended after the restart")
    await kill_a_childs_holder()

    (parent,) = await api.wait_terminal([parent_id], within=120)
    assert parent.status == run_pb2.RUN_STATUS_COMPLETED, parent.error
    steps = await api.steps(parent_id)
    assert_log_well_formed(steps)
    model_log = sandbox_requests(sandbox_model.url)
    assert_no_reask(parent_id, steps, model_log)
    (started,) = [s for s in steps if s.kind == "tool_started"]
    (result,) = [s for s in steps if s.kind == "tool_result"]
    assert result.ref_seq == started.seq
    kids = await db.fetch(
        "SELECT run_id, input, status, output FROM runs WHERE workspace_id = 'ws'"
        " AND parent_run_id = $1 ORDER BY parent_index",
        uuid.UUID(parent_id),
    )
    assert [k["input"] for k in kids] == [f"c{i}" for i in range(20)]
    assert {k["status"] for k in kids} == {"completed"}
    outcomes = result.payload["output"]["children"]
    assert [o["child_run_id"] for o in outcomes] == [str(k["run_id"]) for k in kids]
    assert [o["output"] for o in outcomes] == [k["output"] for k in kids]
    provider_log = sandbox_requests(sandbox_providers.url)
    for kid in kids:
        kid_id = str(kid["run_id"])
        assert_log_well_formed(await api.steps(kid_id))
        mine = [r for r in provider_log if (r["idempotency_key"] or "").startswith(kid_id)]
        assert len(assert_writes_at_most_once(mine, "/mail/send")) == 1
