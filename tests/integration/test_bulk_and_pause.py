"""Bulk cancel by filter and pause/resume (issue 45), with a real control plane, executor,
sandbox model and Postgres."""

from __future__ import annotations

import asyncio
import os
import time

import asyncpg
import grpc
import pytest

from agentrun.v1 import run_pb2
from tests.harness.agentrun_api import Api
from tests.harness.invariants import assert_log_well_formed
from tests.harness.waiting import eventually

# 1,000 in the suite; the 5,000 with AGENTRUN_TEST_BULK_RUNS=5000 (about a minute).
BULK_RUNS = int(os.environ.get("AGENTRUN_TEST_BULK_RUNS", "1000"))


@pytest.fixture
async def stack(db_url, control_plane, sandbox_model, sandbox_providers, executor_factory):
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url)
    other = await Api.connect(cp.address, db_url, workspace="other")
    for a in (api, other):
        await a.publish("quick", "writer", [])
        await a.publish("worker", "slow_worker", ["echo"])
    executor_factory(cp)
    yield api, other
    await api.close()
    await other.close()


async def start_many(api: Api, agent: str, n: int, tags: tuple[str, ...] = ()) -> list[str]:
    ids: list[str] = []
    for first in range(0, n, 100):
        reqs = [
            api.runs.StartRun(
                run_pb2.StartRunRequest(
                    workspace_id=api.ws, agent_id=agent, input=f"run {i}", tags=list(tags)
                )
            )
            for i in range(first, min(n, first + 100))
        ]
        ids += [r.run.run_id for r in await asyncio.gather(*reqs)]
    return ids


async def statuses(db_url: str, ws: str, ids: list[str]) -> dict[str, int]:
    conn = await asyncpg.connect(db_url)
    try:
        rows = await conn.fetch(
            "SELECT status, count(*) AS n FROM runs WHERE workspace_id = $1"
            " AND run_id = ANY($2::uuid[]) GROUP BY status",
            ws,
            ids,
        )
    finally:
        await conn.close()
    return {r["status"]: r["n"] for r in rows}


async def running(api: Api, run_id: str) -> bool:
    return (await api.get(run_id)).status == run_pb2.RUN_STATUS_RUNNING


async def test_bulk_cancel_by_tag_cancels_all_fences_holders_and_others_keep_running(stack, db_url):
    api, other = stack
    held = await start_many(api, "worker", 3, ("sweep",))
    await eventually(lambda: all_running(api, held), timeout=30)
    # The rest stay queued (their agent is paused), as a backlog would.
    pause = run_pb2.SetQueuePausedRequest(workspace_id=api.ws, agent_id="quick", paused=True)
    await api.runs.SetQueuePaused(pause)
    queued = await start_many(api, "quick", BULK_RUNS - 3, ("sweep",))
    untagged = await start_many(api, "worker", 1)
    ids = held + queued

    dry = [p async for p in api.runs.BulkCancelRuns(bulk(api, dry_run=True))]
    assert len(dry) == 1 and dry[0].finished and dry[0].dry_run
    assert dry[0].matched == await unfinished(db_url, api.ws, ids)

    began = time.monotonic()
    # Another workspace's runs are claimed and finish while the action goes on.
    elsewhere = asyncio.ensure_future(start_many(other, "quick", 5))
    progress = [p async for p in api.runs.BulkCancelRuns(bulk(api))]
    took = time.monotonic() - began
    last = progress[-1]
    assert last.finished and not last.dry_run
    assert last.done + last.skipped == last.matched
    assert [p.done for p in progress] == sorted(p.done for p in progress)
    assert len(progress) >= 3  # the count, then a message per batch of at most 500
    assert last.matched == BULK_RUNS and last.done == BULK_RUNS
    assert await statuses(db_url, api.ws, ids) == {"cancelled": BULK_RUNS}
    (done_elsewhere,) = [await other.wait_terminal(await elsewhere, within=60)]
    assert {r.status for r in done_elsewhere} == {run_pb2.RUN_STATUS_COMPLETED}
    assert (await api.get(untagged[0])).status != run_pb2.RUN_STATUS_CANCELLED
    # The holders were fenced: nothing after the cancel's finish step, then or later.
    await asyncio.sleep(1.5)
    for run_id in held:
        steps = await api.steps(run_id)
        assert_log_well_formed(steps)
        assert steps[-1].kind == "finish" and steps[-1].payload["status"] == "cancelled"
    # Audited once, with its filter and count.
    conn = await asyncpg.connect(db_url)
    try:
        rows = await conn.fetch(
            "SELECT detail FROM audit_log WHERE action = 'runs.bulk_cancelled' AND object_id = $1",
            last.action_id,
        )
    finally:
        await conn.close()
    assert len(rows) == 1 and '"tag": "sweep"' in rows[0]["detail"]
    print(f"bulk cancel of {last.matched} runs: {took:.2f}s")


async def all_running(api: Api, ids: list[str]) -> bool:
    return all([await running(api, i) for i in ids])


async def unfinished(db_url: str, ws: str, ids: list[str]) -> int:
    states = await statuses(db_url, ws, ids)
    return sum(n for s, n in states.items() if s in ("queued", "running", "waiting"))


def bulk(api: Api, dry_run: bool = False) -> run_pb2.BulkCancelRunsRequest:
    return run_pb2.BulkCancelRunsRequest(
        workspace_id=api.ws, filter=run_pb2.RunFilter(tag="sweep"), dry_run=dry_run
    )


async def test_bulk_cancel_refuses_an_empty_filter_without_all(stack):
    api, _ = stack
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in api.runs.BulkCancelRuns(run_pb2.BulkCancelRunsRequest(workspace_id=api.ws)):
            pass
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "all" in info.value.details()
    bad = run_pb2.BulkCancelRunsRequest(workspace_id=api.ws, filter=run_pb2.RunFilter(tag="A"))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in api.runs.BulkCancelRuns(bad):
            pass
    assert "filter.tag" in info.value.details()


async def test_a_paused_agent_keeps_its_due_runs_queued_until_resumed(stack, db_url):
    api, _ = stack
    pause = run_pb2.SetQueuePausedRequest(workspace_id=api.ws, agent_id="quick", paused=True)
    await api.runs.SetQueuePaused(pause)
    ids = await start_many(api, "quick", 100)
    # The executor is there and claiming: another agent's run finishes meanwhile.
    (witness,) = await start_many(api, "worker", 1)
    await eventually(lambda: running(api, witness), timeout=30)
    await asyncio.sleep(1.0)
    assert await statuses(db_url, api.ws, ids) == {"queued": 100}
    # GetRun says why it waits.
    assert (await api.get(ids[0])).queue.cause == run_pb2.QUEUE_WAIT_CAUSE_PAUSED
    pause.paused = False
    resumed = await api.runs.SetQueuePaused(pause)
    assert resumed.queued_runs == 100
    runs = await api.wait_terminal(ids, within=90)
    assert {r.status for r in runs} == {run_pb2.RUN_STATUS_COMPLETED}


async def test_a_paused_run_parks_at_a_step_boundary_and_holds_no_executor(stack):
    api, _ = stack
    (run_id,) = await start_many(api, "worker", 1)
    await eventually(lambda: running(api, run_id), timeout=30)
    paused = (
        await api.runs.PauseRun(run_pb2.PauseRunRequest(workspace_id=api.ws, run_id=run_id))
    ).run
    assert paused.paused

    async def parked() -> run_pb2.Run | None:
        run = await api.get(run_id)
        return run if run.status == run_pb2.RUN_STATUS_WAITING else None

    run = await eventually(parked, timeout=30)
    assert run.paused and not run.lease_owner
    await asyncio.sleep(1.5)  # due, but the claim leaves it
    again = await api.get(run_id)
    assert again.status == run_pb2.RUN_STATUS_WAITING and not again.lease_owner
    assert again.queue.cause == run_pb2.QUEUE_WAIT_CAUSE_PAUSED
    steps = await api.steps(run_id)
    assert steps[-1].kind == "park" and "paused" in steps[-1].payload.get("note", "")
    # Nothing in flight when it parked: every started call has its result.
    started = {s.seq for s in steps if s.kind == "tool_started"}
    assert started == {s.ref_seq for s in steps if s.kind == "tool_result"}

    resumed = await api.runs.ResumeRun(run_pb2.ResumeRunRequest(workspace_id=api.ws, run_id=run_id))
    assert not resumed.run.paused

    async def going_on() -> bool:
        later = await api.steps(run_id)
        return len(later) > len(steps) and later[-1].epoch > steps[-1].epoch

    # Claimed again, it goes on from its log under a new epoch.
    await eventually(going_on, timeout=30)
    await api.runs.CancelRun(run_pb2.CancelRunRequest(workspace_id=api.ws, run_id=run_id))
    assert_log_well_formed(await api.steps(run_id))


async def test_a_pause_through_another_replica_reaches_the_holder_at_its_heartbeat(
    stack, db_url, control_plane
):
    api, _ = stack
    second = control_plane(db_url)  # the executor is connected to the first one only
    there = await Api.connect(second.address, db_url)
    try:
        (run_id,) = await start_many(api, "worker", 1)
        await eventually(lambda: running(api, run_id), timeout=30)
        await there.runs.PauseRun(run_pb2.PauseRunRequest(workspace_id=api.ws, run_id=run_id))

        async def parked() -> bool:
            run = await api.get(run_id)
            return run.status == run_pb2.RUN_STATUS_WAITING and not run.lease_owner

        await eventually(parked, timeout=30)
        steps = await api.steps(run_id)
        assert "paused" in steps[-1].payload.get("note", "")
    finally:
        await there.close()


async def test_bulk_rerun_forks_each_matched_run_from_the_start_with_its_labels(stack, db_url):
    api, _ = stack
    ids = await start_many(api, "quick", 3, ("redo",))
    await api.wait_terminal(ids, within=60)
    req = run_pb2.BulkRerunRunsRequest(workspace_id=api.ws, filter=run_pb2.RunFilter(tag="redo"))
    progress = [p async for p in api.runs.BulkRerunRuns(req)]
    last = progress[-1]
    assert (last.matched, last.done, last.skipped, last.finished) == (3, 3, 0, True)
    listed = await api.runs.ListRuns(
        run_pb2.ListRunsRequest(workspace_id=api.ws, tag="redo", page_size=50)
    )
    forks = [r for r in listed.runs if r.forked_from_run_id]
    assert sorted(r.forked_from_run_id for r in forks) == sorted(ids)
    assert all(r.forked_from_seq == 0 and list(r.tags) == ["redo"] for r in forks)
    done = await api.wait_terminal([r.run_id for r in forks], within=60)
    assert {r.status for r in done} == {run_pb2.RUN_STATUS_COMPLETED}
    conn = await asyncpg.connect(db_url)
    try:
        actions = await conn.fetch(
            "SELECT action FROM audit_log WHERE action IN ('runs.bulk_rerun', 'run.forked')"
        )
    finally:
        await conn.close()
    assert [a["action"] for a in actions] == ["runs.bulk_rerun"]
