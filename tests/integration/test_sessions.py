"""Sessions: one turn at a time (ABORTED / HTTP 409 otherwise), and each turn sees the earlier ones."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import asyncpg
import grpc
import httpx
import pytest

from agentrun.v1 import agent_pb2, run_pb2, session_pb2
from control_plane.api.sessions import transcript
from executor import replay
from executor.transcript import build_messages
from tests.harness import auth
from tests.harness.agentrun_api import Api, clear_faults, sandbox_requests, set_fault
from tests.harness.triggers import TriggerApi
from tests.harness.waiting import eventually

WS = "ws"


async def new_session(api: TriggerApi, agent_id: str = "chatter") -> str:
    resp = await api.sessions.CreateSession(
        session_pb2.CreateSessionRequest(workspace_id=WS, agent_id=agent_id, title="support")
    )
    return resp.session.session_id


def send(api: TriggerApi, session_id: str, text: str, request_id: str = ""):
    return api.sessions.SendMessage(
        session_pb2.SendMessageRequest(
            workspace_id=WS, session_id=session_id, text=text, request_id=request_id
        )
    )


async def refused(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


async def http_send(
    base: str, session_id: str, body: dict | bytes, key: str | None
) -> httpx.Response:
    url = f"{base}/v1/workspaces/{WS}/sessions/{session_id}/messages"
    headers = auth.bearer(key) if key else {}
    async with httpx.AsyncClient(timeout=10, headers=headers) as client:
        if isinstance(body, bytes):
            return await client.post(url, content=body)
        return await client.post(url, json=body)


async def test_a_second_message_waits_for_the_turn_and_the_next_turn_sees_the_first(
    db_url, control_plane, executor_factory, sandbox_model
):
    cp = control_plane(db_url)
    api, runs = (
        await TriggerApi.connect(cp.address, db_url, WS),
        await Api.connect(cp.address, db_url, WS),
    )
    await api.publish("chatter", model="chat")
    session_id = await new_session(api)
    first = (await send(api, session_id, "My name is Ada.")).turn
    assert (first.turn, first.status) == (1, run_pb2.RUN_STATUS_QUEUED)

    # In progress (queued, no executor yet): refused over gRPC and over HTTP, naming the turn.
    err = await refused(send(api, session_id, "What is my name?"))
    assert err.code() == grpc.StatusCode.ABORTED
    assert f"turn 1 (run {first.run_id}) is still queued" in err.details()
    conflict = await http_send(cp.http_url, session_id, {"text": "What is my name?"}, api.key)
    assert conflict.status_code == 409 and conflict.json()["code"] == "ABORTED"

    # Running (the model is slow): refused as well.
    set_fault(sandbox_model.url, delay_ms=2500)
    try:
        executor_factory(cp)
        await eventually(
            lambda: _status_is(runs, first.run_id, run_pb2.RUN_STATUS_RUNNING),
            message="turn 1 running",
        )
        err = await refused(send(api, session_id, "What is my name?"))
        assert err.code() == grpc.StatusCode.ABORTED and "is still running" in err.details()
    finally:
        clear_faults(sandbox_model.url)

    (done,) = await runs.wait_terminal([first.run_id])
    assert done.output == "turn 1; the conversation began with: My name is Ada."
    second = await send(api, session_id, "What is my name?")
    assert second.created and second.turn.turn == 2
    (answer,) = await runs.wait_terminal([second.turn.run_id])
    # The model's context began with turn 1's message: it saw the earlier turn.
    assert answer.output == "turn 2; the conversation began with: My name is Ada."
    (input_step,) = [s for s in await runs.steps(second.turn.run_id) if s.kind == "input"]
    assert input_step.payload["text"] == "What is my name?"
    assert input_step.payload["history"] == [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": done.output},
    ]
    sizes = {r["run_id"]: r["n_messages"] for r in sandbox_requests(sandbox_model.url)}
    assert (sizes[first.run_id], sizes[second.turn.run_id]) == (2, 4)  # system+user; +2 history
    session = (
        await api.sessions.GetSession(
            session_pb2.GetSessionRequest(workspace_id=WS, session_id=session_id)
        )
    ).session
    assert session.turn_count == 2 and session.last_turn.output == answer.output
    await api.close()
    await runs.close()


async def _status_is(runs: Api, run_id: str, status: int) -> bool:
    return (await runs.get(run_id)).status == status


# --- in-process server: races and refusals ----------------------------------------------------


@pytest.fixture
async def api(server, db_url):
    client = await TriggerApi.connect(f"127.0.0.1:{server.port}", db_url, WS)
    await client.publish("chatter", model="chat")
    yield client
    await client.close()


async def test_concurrent_messages_start_exactly_one_turn(api, db):
    session_id = await new_session(api)
    results = await asyncio.gather(
        *(send(api, session_id, f"message {i}") for i in range(8)), return_exceptions=True
    )
    created = [r for r in results if not isinstance(r, BaseException)]
    losers = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(created) == 1 and len(losers) == 7
    assert {e.code() for e in losers} == {grpc.StatusCode.ABORTED}
    assert all(created[0].turn.run_id in e.details() for e in losers)  # who won
    assert await db.fetchval("SELECT count(*) FROM runs") == 1
    assert await db.fetchval("SELECT turn_count FROM sessions") == 1


async def test_a_retried_send_with_its_request_id_returns_the_same_turn(api, server):
    session_id = await new_session(api)
    first = await send(api, session_id, "hello", request_id="r-1")
    again = await send(api, session_id, "hello", request_id="r-1")
    assert (first.created, again.created) == (True, False)
    assert first.turn.run_id == again.turn.run_id
    base = f"http://127.0.0.1:{server.http_port}"
    over_http = await http_send(base, session_id, {"text": "hello", "request_id": "r-1"}, api.key)
    assert over_http.status_code == 202
    assert over_http.json() == {
        "turn": 1,
        "run_id": first.turn.run_id,
        "status": "queued",
        "priority": 0,
        "created": False,
    }


async def test_bad_messages_are_refused_naming_the_field_and_store_nothing(api, server, db):
    session_id = await new_session(api)
    base = f"http://127.0.0.1:{server.http_port}"
    empty = await refused(send(api, session_id, ""))
    assert (empty.code(), empty.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "text: is required",
    )
    bad_id = await refused(send(api, "not-a-uuid", "hi"))
    assert bad_id.details().startswith("session_id:")
    missing = await refused(send(api, "00000000-0000-0000-0000-000000000000", "hi"))
    assert missing.code() == grpc.StatusCode.NOT_FOUND
    answers = [
        await http_send(base, session_id, {"text": ""}, api.key),
        await http_send(base, session_id, {"text": 5}, api.key),
        await http_send(base, "not-a-uuid", {"text": "hi"}, api.key),
        await http_send(base, "00000000-0000-0000-0000-000000000000", {"text": "hi"}, api.key),
        await http_send(base, session_id, b"{", api.key),
    ]
    assert [a.status_code for a in answers] == [400, 400, 400, 404, 400]
    assert [a.json()["error"].split(":")[0] for a in answers] == [
        "text",
        "text",
        "session_id",
        "session 00000000-0000-0000-0000-000000000000 not found",
        "body",
    ]
    unknown_agent = await refused(
        api.sessions.CreateSession(
            session_pb2.CreateSessionRequest(workspace_id=WS, agent_id="nobody")
        )
    )
    assert unknown_agent.code() == grpc.StatusCode.NOT_FOUND
    assert await db.fetchval("SELECT count(*) FROM runs") == 0


# --- the transcript, as pure functions ---------------------------------------------------------


def turn(n: int, status: str = "completed", output: str | None = None) -> dict:
    return {
        "turn": n,
        "input": f"question {n}",
        "status": status,
        "output": output if output is not None else f"answer {n}",
    }


def test_transcript_keeps_answers_of_completed_turns_and_drops_the_oldest_to_fit():
    history = transcript([turn(1), turn(2, "failed", ""), turn(3)])
    assert history == [
        {"role": "user", "content": "question 1"},
        {"role": "assistant", "content": "answer 1"},
        {"role": "user", "content": "question 2"},
        {"role": "user", "content": "question 3"},
        {"role": "assistant", "content": "answer 3"},
    ]
    one_turn = len(json.dumps(history[:2]).encode())
    assert transcript([turn(1), turn(2), turn(3)], max_bytes=one_turn * 2)[0]["content"] == (
        "question 2"
    )


def test_the_executor_puts_the_history_before_the_new_message():
    entries = [
        replay.Entry(
            0,
            replay.INPUT,
            0,
            {
                "text": "What is my name?",
                "history": [
                    {"role": "user", "content": "I am Ada."},
                    {"role": "assistant", "content": "Hello Ada."},
                    {"role": "tool", "content": "ignored"},
                ],
            },
        )
    ]
    assert build_messages(entries, "be brief") == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "I am Ada."},
        {"role": "assistant", "content": "Hello Ada."},
        {"role": "user", "content": "What is my name?"},
    ]


async def test_agentrun_chat_streams_each_turn_and_remembers_the_conversation(
    db_url, control_plane, executor_factory
):
    cp = control_plane(db_url)
    api = await TriggerApi.connect(cp.address, db_url, WS)
    await api.publish("chatter", model="chat")
    executor_factory(cp)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentrun_cli",
        "--address",
        cp.address,
        "--workspace",
        WS,
        "chat",
        "chatter",
        "--priority",
        "5",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "AGENTRUN_API_KEY": api.key},
    )
    out, err = await asyncio.wait_for(proc.communicate(b"I am Grace.\nWho am I?\n"), timeout=120)
    text = out.decode()
    assert proc.returncode == 0, err.decode()
    assert "(session " in text
    assert "agent> turn 1; the conversation began with: I am Grace." in text
    assert "agent> turn 2; the conversation began with: I am Grace." in text
    # Each turn's steps were streamed (its decision and its finish) before its answer.
    assert text.count("  · ") == 4 and '  · says "turn 2' in text
    # Each turn's run ran at the chat's --priority.
    conn = await asyncpg.connect(db_url)
    try:
        # (The release self-check's runs are the canary workspace's.)
        mine = await conn.fetch("SELECT priority FROM runs WHERE workspace_id = $1", WS)
        assert [r["priority"] for r in mine] == [5, 5]
    finally:
        await conn.close()
    await api.close()


async def test_a_turn_copies_every_limit_of_the_agent_version_at_admission(db_url, control_plane):
    cp = control_plane(db_url)
    api, runs = (
        await TriggerApi.connect(cp.address, db_url, WS),
        await Api.connect(cp.address, db_url, WS),
    )
    await api.publish("chatter", model="chat")
    limits = agent_pb2.RunLimits(max_steps=7, max_tool_calls=9, model_retry_budget=4)
    spec = agent_pb2.AgentSpec(model="chat", instructions="test agent", limits=limits)
    await api.agents.PublishAgentVersion(
        agent_pb2.PublishAgentVersionRequest(workspace_id=WS, agent_id="chatter", spec=spec)
    )
    turn = (await send(api, await new_session(api), "hello")).turn
    run = await runs.get(turn.run_id)
    assert (run.limits.max_steps, run.limits.max_tool_calls, run.limits.model_retry_budget) == (
        7,
        9,
        4,
    )
    await runs.close()


async def test_the_http_session_route_needs_an_operating_key_and_stores_nothing_without(
    api, server, db, db_url
):
    session_id = await new_session(api)
    base = f"http://127.0.0.1:{server.http_port}"
    before = [await db.fetchval(f"SELECT count(*) FROM {t}") for t in ("runs", "session_turns")]
    reader = await auth.workspace_key(db_url, WS, role="reader")
    other = await auth.workspace_key(db_url, "another-ws", role="operator")
    answers = {
        "none": await http_send(base, session_id, {"text": "hi"}, None),
        "garbage": await http_send(base, session_id, {"text": "hi"}, "agr_ws_nope"),
        "reader": await http_send(base, session_id, {"text": "hi"}, reader),
        "other workspace": await http_send(base, session_id, {"text": "hi"}, other),
    }
    assert {k: a.status_code for k, a in answers.items()} == {
        "none": 401,
        "garbage": 401,
        "reader": 403,
        "other workspace": 403,
    }
    after = [await db.fetchval(f"SELECT count(*) FROM {t}") for t in ("runs", "session_turns")]
    assert after == before
    assert (await http_send(base, session_id, {"text": "hi"}, api.key)).status_code == 202


async def test_a_turn_records_who_sent_its_message(api, server, db, db_url):
    """Four eyes reads runs.started_by: a session turn is started by the message's sender."""
    over_grpc = await send(api, await new_session(api), "first")
    operator = await auth.workspace_key(db_url, WS, role="operator", principal="ops-olga")
    base = f"http://127.0.0.1:{server.http_port}"
    over_http = await http_send(base, await new_session(api), {"text": "second"}, operator)
    assert over_http.status_code == 202, over_http.text
    started = dict(await db.fetch("SELECT run_id::text, started_by FROM runs"))
    assert started == {
        over_grpc.turn.run_id: "key:tester",
        over_http.json()["run_id"]: "key:ops-olga",
    }
