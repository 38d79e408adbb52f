"""Signals with real processes: RunService.SignalRun (and `agentrun runs signal`) delivers a
named event to a run's wait_for_signal call once, whether it comes before the run parks,
while it parks or after; idempotent by event id; a timeout ends the wait; a run that ended
refuses new signals."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess

import grpc
import pytest

from agentrun.v1 import run_pb2
from tests.harness import auth
from tests.harness.agentrun_api import Api
from tests.harness.cli import agentrun_async
from tests.harness.waiting import eventually

TOOL = "wait_for_signal"


@pytest.fixture
async def stack(db_url, control_plane, sandbox_model, sandbox_providers):
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url)
    await api.publish("waiter", "signal_twice", [TOOL])
    await api.publish("timer", "signal_timeout", [TOOL])
    yield cp, api
    await api.close()


async def signal(
    api: Api, run_id: str, name: str, event_id: str, payload: object
) -> run_pb2.SignalRunResponse:
    return await api.runs.SignalRun(
        run_pb2.SignalRunRequest(
            workspace_id=api.ws,
            run_id=run_id,
            signal_name=name,
            event_id=event_id,
            payload_json=json.dumps(payload),
        )
    )


def waits(steps) -> tuple[list, list]:
    started = [s for s in steps if s.kind == "tool_started" and s.payload["tool"] == TOOL]
    results = [s for s in steps if s.kind == "tool_result" and s.payload["tool"] == TOOL]
    return started, results


async def waiting_on_second_call(api: Api, run_id: str) -> bool:
    run = await api.get(run_id)
    started, results = waits(await api.steps(run_id))
    return run.wait_reason == "signal" and len(started) == 2 and len(results) == 1


async def cli(address: str, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    return await agentrun_async(address, key, *args, workspace="ws", timeout=60)


async def test_signals_before_and_after_the_park_each_answer_one_wait(
    stack, executor_factory, db_url
):
    cp, api = stack
    run_id = await api.start("waiter", "go")
    # Sent before any executor exists: it waits in the run's mailbox.
    early = await signal(api, run_id, "step", "e1", {"n": 1})
    assert early.created and early.signal.consumed_seq == 0
    executor_factory(cp)
    await eventually(
        lambda: waiting_on_second_call(api, run_id),
        timeout=30,
        message="the run never waited on its second signal",
    )
    parked = await api.get(run_id)
    assert parked.status == run_pb2.RUN_STATUS_WAITING and not parked.HasField("wake_time")
    # Sent while it waits, through the CLI: the call's result at once, and the run wakes.
    key = await auth.workspace_key(db_url, "ws", role="operator")
    done = await cli(
        cp.address,
        key,
        "runs",
        "signal",
        run_id,
        "step",
        "--event-id",
        "e2",
        "--payload",
        '{"n": 2}',
    )
    assert done.returncode == 0, done.stderr
    assert "answered call" in done.stdout
    (run,) = await api.wait_terminal([run_id], within=30)
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    started, results = waits(await api.steps(run_id))
    assert [r.ref_seq for r in results] == [s.seq for s in started]
    assert [r.payload["output"]["payload"] for r in results] == [{"n": 1}, {"n": 2}]
    assert [r.payload["output"]["event_id"] for r in results] == ["e1", "e2"]
    assert '"n": 2' in run.output or '"n":2' in run.output
    # The same event again, even after the end: the first answer, nothing new.
    again = await signal(api, run_id, "step", "e1", {"n": 1})
    assert not again.created and again.signal.consumed_seq == started[0].seq
    assert again.signal.result_seq == results[0].seq
    with pytest.raises(grpc.aio.AioRpcError) as used:
        await signal(api, run_id, "step", "e1", {"n": 99})
    assert used.value.code() == grpc.StatusCode.ALREADY_EXISTS
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        await signal(api, run_id, "step", "e3", {})
    assert ended.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert len(waits(await api.steps(run_id))[1]) == 2


async def test_bad_signals_are_refused_naming_the_field_and_readers_cannot_send(stack):
    cp, api = stack
    run_id = await api.start("waiter", "go")
    for field, request in (
        ("signal_name", {"signal_name": "no spaces", "event_id": "e"}),
        ("event_id", {"signal_name": "step", "event_id": ""}),
        ("payload_json", {"signal_name": "step", "event_id": "e", "payload_json": "{nope"}),
        ("run_id", {"signal_name": "step", "event_id": "e", "run_id": "not-a-uuid"}),
    ):
        fields = {"workspace_id": "ws", "run_id": run_id, **request}
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await api.runs.SignalRun(run_pb2.SignalRunRequest(**fields))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
        assert field in (bad.value.details() or ""), field
    reader = await Api.connect(cp.address, api.db_url, role="reader")
    try:
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await signal(reader, run_id, "step", "e", None)
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await reader.close()
    # Nothing was written: the first real signal is created, and the first in the mailbox.
    first = await signal(api, run_id, "step", "e", None)
    assert first.created


async def test_a_wait_with_a_timeout_ends_without_a_signal(stack, executor_factory):
    cp, api = stack
    run_id = await api.start("timer", "go")
    executor_factory(cp)
    (run,) = await api.wait_terminal([run_id], within=30)
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    _, (result,) = waits(await api.steps(run_id))
    assert result.payload["output"]["timed_out"] is True
    assert result.payload["output"]["payload"] is None


async def test_signals_racing_the_park_commits_of_many_runs_each_arrive_once(
    stack, executor_factory
):
    cp, api = stack
    rng = random.Random(11)
    run_ids = [await api.start("waiter", f"go {i}") for i in range(10)]
    executor_factory(cp, count=2)

    async def send_two(run_id: str) -> None:
        for n in (1, 2):
            await asyncio.sleep(rng.uniform(0, 0.6))  # spread over parks and commits in flight
            await signal(api, run_id, "step", f"{run_id}:{n}", {"n": n})

    await asyncio.gather(*(send_two(r) for r in run_ids))
    finished = await api.wait_terminal(run_ids, within=60)
    assert all(r.status == run_pb2.RUN_STATUS_COMPLETED for r in finished)
    for run_id in run_ids:
        started, results = waits(await api.steps(run_id))
        assert [r.ref_seq for r in results] == [s.seq for s in started]
        assert [r.payload["output"]["payload"] for r in results] == [{"n": 1}, {"n": 2}]
