"""A rolling deploy under load with SIGTERM (issue 41): executors of release A are
replaced one by one by executors of B while runs work and others sleep.

Each SIGTERM drains one executor: it claims nothing more, hands each run back at its
next turn boundary (on no release) and exits. Nobody runs `releases move`: the handed-back
runs and every parked run continue on B. Afterwards: every run completed, none waits on A,
every turn's steps (a model decision and what followed it, up to the next decision) carry
one release, the sleepers' steps after their park carry B, each echo call was sent
exactly once, and each run's epochs never go down along its log.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

from agentrun.v1 import release_pb2, release_pb2_grpc, run_pb2
from tests.harness import auth
from tests.harness.agentrun_api import Api, sandbox_requests
from tests.harness.waiting import eventually

WORKING = 16  # slow_worker: ten one-second model replies, ten echoes
PARKED = 16  # deploy_sleep: an eight-second durable sleep, then an echo


async def steps_of(api: Api, run_id: str) -> list[run_pb2.Step]:
    resp = await api.runs.ListRunSteps(
        run_pb2.ListRunStepsRequest(workspace_id=api.ws, run_id=run_id, page_size=1000)
    )
    return list(resp.steps)


def turns(steps: list[run_pb2.Step]) -> list[list[run_pb2.Step]]:
    """The run's turns: each model decision with the steps after it, up to the next, or
    up to a park between turns (a sleep's park ends what the decision began; its result,
    written on waking, opens the next part). A hand-back ("handoff") splits nothing: a
    turn handed back in progress must continue on its release."""
    out: list[list[run_pb2.Step]] = []
    for step in steps:
        if step.kind == run_pb2.STEP_KIND_MODEL_DECISION:
            out.append([])
        if out and step.epoch:
            out[-1].append(step)
        if step.kind == run_pb2.STEP_KIND_PARK and json.loads(step.payload_json).get(
            "wait_reason"
        ) not in ("handoff", "executor_error"):
            out.append([])
    return out


async def test_a_rolling_sigterm_deploy_strands_nothing_and_parked_runs_finish_on_b(
    db_url, control_plane, executor_factory, sandbox_providers
):
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url, "acme")
    await api.publish("worker", "slow_worker", ["echo"])
    await api.publish("sleeper", "deploy_sleep", ["sleep", "echo"])
    key = await auth.platform_key(db_url)
    channel = auth.channel(cp.address, key)
    stub = release_pb2_grpc.ReleaseServiceStub(channel)
    team_a = executor_factory(cp, count=2, AGENTRUN_RELEASE="A", AGENTRUN_CAPACITY=24)
    workers = [await api.start("worker", f"work {n}") for n in range(WORKING)]
    sleepers = [await api.start("sleeper", f"sleep {n}") for n in range(PARKED)]

    async def under_way() -> bool:
        runs = [await api.get(r) for r in workers + sleepers]
        parked = sum(r.status == run_pb2.RUN_STATUS_WAITING for r in runs[WORKING:])
        held = sum(r.status == run_pb2.RUN_STATUS_RUNNING for r in runs[:WORKING])
        return parked == PARKED and held == WORKING

    await eventually(under_way, timeout=60, message="the runs never got under way on A")
    # One by one: a B executor starts, an A executor is sent SIGTERM and drains.
    team_b = []
    for old in team_a:
        team_b += executor_factory(cp, AGENTRUN_RELEASE="B", AGENTRUN_CAPACITY=24)
        assert await asyncio.to_thread(old.terminate, 60) == 0, old.log_tail()

    done = await api.wait_terminal(workers + sleepers, within=120)
    assert {r.status for r in done} == {run_pb2.RUN_STATUS_COMPLETED}, done
    a = (await stub.GetRelease(release_pb2.GetReleaseRequest(name="A"))).release
    assert a.runs_held == 0 and a.runs_waiting == 0 and not a.executors, a
    mixed, moved = [], 0
    for run in done:
        steps = await steps_of(api, run.run_id)
        epochs = [s.epoch for s in steps]
        assert epochs == sorted(epochs), f"run {run.run_id}: a step under a stale epoch"
        mixed += [
            f"{run.run_id}: " + ", ".join(f"{s.seq}@{s.release}" for s in turn)
            for turn in turns(steps)
            if len({s.release for s in turn}) > 1
        ]
        if run.run_id in sleepers:
            park = max(s.seq for s in steps if s.kind == run_pb2.STEP_KIND_PARK)
            assert {s.release for s in steps if s.seq > park and s.epoch} == {"B"}, steps
        moved += "B" in {s.release for s in steps}
    assert mixed == [], f"turns that ran on two releases: {mixed}"
    print(f"{moved} of {len(done)} runs continued on B after A drained")
    assert moved >= PARKED
    ours = set(workers + sleepers)
    sent = Counter(
        r["idempotency_key"]
        for r in sandbox_requests(sandbox_providers.url)
        if str(r["idempotency_key"] or "").split(":")[0] in ours
    )
    print(f"{len(sent)} echo calls, sent {sum(sent.values())} times")
    assert len(sent) == WORKING * 10 + PARKED, "an echo call is missing"
    assert max(sent.values()) == 1, "an echo call was sent twice"
    assert all(b.alive for b in team_b)
    await api.close()
    await channel.close()
