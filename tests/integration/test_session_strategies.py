"""Session strategies: a message sent while a turn runs is enqueued, interrupts it, or rolls
it back (issue 17, item 4); `reject` (409) is covered by test_sessions.py."""

from __future__ import annotations

import grpc
import httpx
import pytest

from agentrun.v1 import run_pb2, session_pb2
from tests.harness import auth
from tests.harness.agentrun_api import Api, clear_faults, sandbox_requests, set_fault
from tests.harness.triggers import TriggerApi
from tests.harness.waiting import eventually

WS = "ws"
S = session_pb2


async def new_session(api: TriggerApi, agent_id: str, strategy: int = 0) -> str:
    req = S.CreateSessionRequest(workspace_id=WS, agent_id=agent_id, strategy=strategy)
    return (await api.sessions.CreateSession(req)).session.session_id


async def send(api: TriggerApi, session_id: str, text: str, strategy: int = 0) -> S.Turn:
    req = S.SendMessageRequest(workspace_id=WS, session_id=session_id, text=text, strategy=strategy)
    return (await api.sessions.SendMessage(req)).turn


def requests_of(url: str, run_id: str) -> list[dict]:
    return [r for r in sandbox_requests(url) if r["run_id"] == run_id]


async def running(runs: Api, run_id: str) -> bool:
    return (await runs.get(run_id)).status == run_pb2.RUN_STATUS_RUNNING


async def test_messages_sent_during_a_turn_become_the_next_turns_in_order_each_once(
    db_url, control_plane, executor_factory, sandbox_model, db
):
    cp = control_plane(db_url)
    api, runs = (
        await TriggerApi.connect(cp.address, db_url, WS),
        await Api.connect(cp.address, db_url, WS),
    )
    await api.publish("chatter", model="chat")
    session_id = await new_session(api, "chatter", S.SESSION_STRATEGY_ENQUEUE)
    first = await send(api, session_id, "My name is Ada.")
    set_fault(sandbox_model.url, delay_ms=1500)
    try:
        executor_factory(cp)
        await eventually(lambda: running(runs, first.run_id), message="turn 1 running")
        second = await send(api, session_id, "What is my name?")
        third = await send(api, session_id, "And again?")
    finally:
        clear_faults(sandbox_model.url)
    assert [(t.turn, t.status) for t in (second, third)] == [
        (2, run_pb2.RUN_STATUS_WAITING),
        (3, run_pb2.RUN_STATUS_WAITING),
    ]
    done = await runs.wait_terminal([first.run_id, second.run_id, third.run_id])
    assert [r.status for r in done] == [run_pb2.RUN_STATUS_COMPLETED] * 3
    # Each turn asked the model once, in turn order: the next began after the previous ended.
    order = [
        r["run_id"]
        for r in sandbox_requests(sandbox_model.url)
        if r["run_id"] in (first.run_id, second.run_id, third.run_id)
    ]
    assert order == [first.run_id, second.run_id, third.run_id]
    ends = {r.run_id: r.finish_time.ToDatetime() for r in done}
    claims = await db.fetch(
        "SELECT run_id::text, min(created_at) AS at FROM steps WHERE run_id = ANY($1::uuid[])"
        " AND seq > 0 GROUP BY run_id",
        [second.run_id, third.run_id],
    )
    firsts = {r["run_id"]: r["at"].replace(tzinfo=None) for r in claims}
    assert firsts[second.run_id] >= ends[first.run_id]
    assert firsts[third.run_id] >= ends[second.run_id]
    (input_step,) = [s for s in await runs.steps(third.run_id) if s.kind == "input"]
    assert [m["content"] for m in input_step.payload["history"]] == [
        "My name is Ada.",
        done[0].output,
        "What is my name?",
        done[1].output,
    ]
    assert await db.fetchval("SELECT count(*) FROM runs WHERE agent_id = 'chatter'") == 3
    await api.close()
    await runs.close()


@pytest.mark.parametrize("strategy", ["interrupt", "rollback"])
async def test_a_new_message_cancels_the_running_turn_which_writes_nothing_after(
    strategy, db_url, control_plane, executor_factory, sandbox_model
):
    cp = control_plane(db_url)
    api, runs = (
        await TriggerApi.connect(cp.address, db_url, WS),
        await Api.connect(cp.address, db_url, WS),
    )
    await api.publish("stepper", model="session_steps", tools=("echo",))
    session_id = await new_session(api, "stepper")
    first = await send(api, session_id, "the zebra-7 ledger")

    async def worked_a_step() -> bool:
        return any(s.kind == "tool_result" for s in await runs.steps(first.run_id))

    set_fault(sandbox_model.url, delay_ms=1500)
    try:
        executor_factory(cp)
        await eventually(worked_a_step, timeout=30, message="turn 1 committed a tool result")
        how = (
            S.SESSION_STRATEGY_INTERRUPT if strategy == "interrupt" else S.SESSION_STRATEGY_ROLLBACK
        )
        second = await send(api, session_id, "something else", how)
        assert (second.turn, second.status) == (2, run_pb2.RUN_STATUS_QUEUED)
        cancelled = await runs.get(first.run_id)
        assert cancelled.status == run_pb2.RUN_STATUS_CANCELLED
        at_cancel = await runs.steps(first.run_id)
        assert at_cancel[-1].kind == "finish" and at_cancel[-1].payload["status"] == "cancelled"
        # Turn 1's second model call was in flight: it returns, and its commit is fenced.
        await eventually(
            lambda: len(requests_of(sandbox_model.url, first.run_id)) >= 2,
            timeout=30,
            message="turn 1's in-flight model call returned",
        )
    finally:
        clear_faults(sandbox_model.url)
    (answer,) = await runs.wait_terminal([second.run_id])
    assert answer.status == run_pb2.RUN_STATUS_COMPLETED
    assert await runs.steps(first.run_id) == at_cancel  # nothing written after the cancel
    prompt = requests_of(sandbox_model.url, second.run_id)[0]["prompt"]  # the turn's first ask
    assert "something else" in prompt
    if strategy == "interrupt":  # the transcript so far, the interrupted turn's steps included
        assert "the zebra-7 ledger" in prompt and "Looking up" in prompt, prompt[-1200:]
        assert "lookup notes" in prompt
    else:  # the rolled-back turn is not shown at all
        assert "zebra-7" not in prompt and "Looking up" not in prompt
        assert "lookup notes" not in prompt
    await api.close()
    await runs.close()


@pytest.fixture
async def api(server, db_url):
    client = await TriggerApi.connect(f"127.0.0.1:{server.port}", db_url, WS)
    await client.publish("chatter", model="chat")
    yield client
    await client.close()


async def test_an_unknown_strategy_is_refused_naming_the_field_and_stores_nothing(api, server, db):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await new_session(api, "chatter", 99)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "strategy" in info.value.details()
    assert await db.fetchval("SELECT count(*) FROM sessions") == 0
    session_id = await new_session(api, "chatter", S.SESSION_STRATEGY_ROLLBACK)
    got = (
        await api.sessions.GetSession(S.GetSessionRequest(workspace_id=WS, session_id=session_id))
    ).session
    assert got.strategy == S.SESSION_STRATEGY_ROLLBACK
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await send(api, session_id, "hi", 7)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "strategy" in info.value.details()
    url = f"http://127.0.0.1:{server.http_port}/v1/workspaces/{WS}/sessions/{session_id}/messages"
    async with httpx.AsyncClient(timeout=10, headers=auth.bearer(api.key)) as client:
        resp = await client.post(url, json={"text": "hi", "strategy": "later"})
    assert resp.status_code == 400 and "strategy" in resp.text
    assert await db.fetchval("SELECT count(*) FROM runs") == 0


async def test_a_parked_turn_waits_for_every_turn_before_it_even_when_one_is_cancelled(
    api, server, db_url, db
):
    runs = await Api.connect(f"127.0.0.1:{server.port}", db_url, WS)
    session_id = await new_session(api, "chatter")  # reject, overridden per message below
    first = await send(api, session_id, "one")  # no executor: it stays queued
    second = await send(api, session_id, "two", S.SESSION_STRATEGY_ENQUEUE)
    url = f"http://127.0.0.1:{server.http_port}/v1/workspaces/{WS}/sessions/{session_id}/messages"
    async with httpx.AsyncClient(timeout=10, headers=auth.bearer(api.key)) as client:
        resp = await client.post(url, json={"text": "three", "strategy": "enqueue"})
    assert resp.status_code == 202 and resp.json()["status"] == "waiting"
    third = S.Turn(turn=resp.json()["turn"], run_id=resp.json()["run_id"])
    assert (second.turn, third.turn) == (2, 3)

    async def woken(run_id: str) -> bool:
        return await db.fetchval("SELECT wake_at IS NOT NULL FROM runs WHERE run_id = $1", run_id)

    cancel = run_pb2.CancelRunRequest(workspace_id=WS, run_id=second.run_id)
    await runs.runs.CancelRun(cancel)
    assert not await woken(third.run_id)  # turn 1 has not ended: turn 3 stays parked
    await runs.runs.CancelRun(run_pb2.CancelRunRequest(workspace_id=WS, run_id=first.run_id))
    assert await woken(third.run_id)  # woken in the transaction that ended turn 1
    (input_step,) = [s for s in await runs.steps(third.run_id) if s.kind == "input"]
    assert input_step.payload["history"] == [
        {"role": "user", "content": "one"},
        {"role": "user", "content": "two"},
    ]
    await runs.close()
