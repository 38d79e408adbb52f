"""Hostile input is refused, named and not stored (issue 10, defects 3 and 4).

NUL characters in text fields, JSON nested thousands deep and undecodable bytes used to
come back INTERNAL, UNKNOWN (with a traceback per request) or HTTP 500. Each is now
INVALID_ARGUMENT / 400 naming the field or the message, with nothing written.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import pytest

from agentrun.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    approval_pb2,
    approval_pb2_grpc,
    executor_pb2,
    run_pb2,
    run_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
)
from control_plane.approvals.hashing import arguments_sha256, canonical_json
from control_plane.server import RunningServer
from control_plane.store import lease, runs, steps
from control_plane.triggers.signatures import sign
from tests import factories
from tests.harness import auth
from tests.harness.commits import approval_commit
from tests.harness.fuzzing import Callers, table_counts
from tests.harness.logs import tracebacks
from tests.harness.triggers import TriggerApi

WS = "ws"
CONNECT = "/agentrun.v1.ExecutorService/Connect"


@pytest.fixture
async def callers(db_url: str) -> Callers:
    """A key of each role of ws (the approver's named alice), an executor and a platform key."""
    found = await Callers.mint(db_url, WS)
    key = await auth.workspace_key(db_url, WS, role="approver", principal="alice@example.com")
    found.texts["approver"] = key
    return found


def _as(callers: Callers, method: str) -> tuple[tuple[str, str], ...]:
    return callers.metadata(f"/agentrun.v1.{method}")


@pytest.fixture
async def channel(server: RunningServer) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        yield ch


async def pending_approval(server: RunningServer) -> uuid.UUID:
    """A run parked on an approval of send_email, as an executor's commit leaves it."""
    pool = server.pool
    policy = {"approvers": ["alice@example.com"], "on_expiry": "reject", "expiry_seconds": 3600}
    await factories.agent_version(
        pool, WS, "mailer", {**factories.DEFAULT_SPEC, "approval": policy}
    )
    run = await runs.insert_run(pool, runs.Admission(WS, "mailer", 1, "go", None, 50, 1000, 10, 60))
    held = [r for r in await lease.claim_due(pool, ["ex"], 30) if r.run_id == run.run_id]
    arguments = {"to": "ada@example.com"}
    approval_id = uuid.uuid4()
    decision = {
        "content": None,
        "tool_calls": [{"id": "c1", "name": "send_email", "arguments": arguments}],
    }
    req = steps.CommitRequest(
        WS,
        run.run_id,
        held[0].lease_epoch,
        [
            steps.NewStep(1, "model_decision", None, json.dumps(decision)),
            steps.NewStep(
                2, "approval_requested", 1, json.dumps({"approval_id": str(approval_id)})
            ),
        ],
        steps.Transition(status="waiting", wait_reason="approval"),
    )
    ask = executor_pb2.ApprovalRequest(
        approval_id=str(approval_id),
        decision_seq=1,
        call_id="c1",
        tool="send_email",
        arguments_json=canonical_json(arguments),
        arguments_sha256=arguments_sha256(arguments),
    )
    await approval_commit(pool, req, ask, 30)
    return approval_id


@pytest.fixture
async def world(
    server: RunningServer, channel: grpc.aio.Channel, callers: Callers
) -> dict[str, Any]:
    """A published agent, a session, a queued run and a pending approval to aim requests at."""
    approval_id = await pending_approval(server)  # first: its run is the only one to claim
    await factories.agent_version(server.pool, WS, "agent")
    sessions = session_pb2_grpc.SessionServiceStub(channel)
    session = await sessions.CreateSession(
        session_pb2.CreateSessionRequest(workspace_id=WS, agent_id="agent"),
        metadata=_as(callers, "SessionService/CreateSession"),
    )
    run = await run_pb2_grpc.RunServiceStub(channel).StartRun(
        run_pb2.StartRunRequest(workspace_id=WS, agent_id="agent", input="hi"),
        metadata=_as(callers, "RunService/StartRun"),
    )
    return {
        "session_id": session.session.session_id,
        "run_id": run.run.run_id,
        "approval_id": str(approval_id),
    }


def _requests(w: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """field path -> (method, request holding a NUL in that field)."""
    ap = {"workspace_id": WS, "approval_id": w["approval_id"], "approver": "alice@example.com"}
    return {
        "display_name": (
            "AgentService/CreateAgent",
            agent_pb2.CreateAgentRequest(workspace_id=WS, agent_id="other", display_name="Ada\x00"),
        ),
        "request_id": (
            "RunService/StartRun",
            run_pb2.StartRunRequest(
                workspace_id=WS, agent_id="agent", input="hi", request_id="r-\x001"
            ),
        ),
        "input": (
            "RunService/StartRun",
            run_pb2.StartRunRequest(workspace_id=WS, agent_id="agent", input="hi\x00"),
        ),
        "reason": (
            "RunService/CancelRun",
            run_pb2.CancelRunRequest(workspace_id=WS, run_id=w["run_id"], reason="stop\x00"),
        ),
        "title": (
            "SessionService/CreateSession",
            session_pb2.CreateSessionRequest(workspace_id=WS, agent_id="agent", title="chat\x00"),
        ),
        "text": (
            "SessionService/SendMessage",
            session_pb2.SendMessageRequest(
                workspace_id=WS, session_id=w["session_id"], text="hello\x00"
            ),
        ),
        "reject.reason": (
            "ApprovalService/DecideApproval",
            approval_pb2.DecideApprovalRequest(**ap, reject=approval_pb2.Reject(reason="no\x00")),
        ),
        "edit.note": (
            "ApprovalService/DecideApproval",
            approval_pb2.DecideApprovalRequest(
                **ap,
                edit=approval_pb2.Edit(
                    arguments_json='{"to": "bob@example.com"}', note="changed\x00"
                ),
            ),
        ),
    }


async def _unary(
    channel: grpc.aio.Channel, callers: Callers, method: str, request: Any
) -> grpc.aio.AioRpcError:
    call = channel.unary_unary(f"/agentrun.v1.{method}", lambda m: m.SerializeToString(), bytes)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(request, timeout=10, metadata=_as(callers, method))
    return info.value


@pytest.mark.parametrize(
    "field",
    [
        "display_name",
        "request_id",
        "input",
        "reason",
        "title",
        "text",
        "reject.reason",
        "edit.note",
    ],
)
async def test_a_nul_in_a_text_field_is_invalid_argument_naming_it(
    server: RunningServer,
    channel: grpc.aio.Channel,
    world: dict[str, Any],
    db: Any,
    caplog: pytest.LogCaptureFixture,
    field: str,
    callers: Callers,
) -> None:
    method, request = _requests(world)[field]
    before = await table_counts(db)
    err = await _unary(channel, callers, method, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert err.details() == f"{field}: contains a NUL character"
    # The pending approval's notice is relayed in the background and mints a link token.
    assert _but_relay(await table_counts(db)) == _but_relay(before)
    assert not tracebacks(caplog.records)
    approval = await db.fetchrow("SELECT decision FROM approvals")
    assert approval["decision"] is None  # the approval was not decided by a refused request


async def test_edit_arguments_nested_5000_deep_is_refused_and_decides_nothing(
    server: RunningServer,
    channel: grpc.aio.Channel,
    world: dict[str, Any],
    db: Any,
    caplog: pytest.LogCaptureFixture,
    callers: Callers,
) -> None:
    deep = '{"to": ' + "[" * 5000 + "]" * 5000 + "}"
    request = approval_pb2.DecideApprovalRequest(
        workspace_id=WS,
        approval_id=world["approval_id"],
        approver="alice@example.com",
        edit=approval_pb2.Edit(arguments_json=deep, note="deeper"),
    )
    before = await table_counts(db)
    stub = approval_pb2_grpc.ApprovalServiceStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.DecideApproval(
            request, timeout=10, metadata=_as(callers, "ApprovalService/DecideApproval")
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "edit.arguments_json: is nested deeper than 64 levels"
    assert _but_relay(await table_counts(db)) == _but_relay(before)
    assert (await db.fetchrow("SELECT decision FROM approvals"))["decision"] is None
    assert not tracebacks(caplog.records)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"\xff\xff\xff\xff", "random bytes"),
        (b"\x0a\x02\xc3\x28", "invalid UTF-8 in workspace_id"),
        (b"\x12\xe8\x07short", "a field longer than the message"),
    ],
)
async def test_undecodable_bytes_are_invalid_argument_with_one_log_line_and_no_traceback(
    server: RunningServer,
    channel: grpc.aio.Channel,
    caplog: pytest.LogCaptureFixture,
    data: bytes,
    problem: str,
    callers: Callers,
) -> None:
    caplog.set_level(logging.INFO)
    for method, name in (
        ("AgentService/CreateAgent", "CreateAgentRequest"),
        ("RunService/WatchRun", "WatchRunRequest"),
    ):
        caplog.clear()
        if method.endswith("WatchRun"):
            call: Any = channel.unary_stream(f"/agentrun.v1.{method}", None, bytes)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in call(data, timeout=10, metadata=_as(callers, method)):
                    pass
            err = info.value
        else:
            err = await _unary(channel, callers, method, _Raw(data))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (problem, err.details())
        assert err.details() == f"request is not a valid {name}"
        lines = [r for r in caplog.records if name in r.getMessage()]
        assert len(lines) == 1 and not lines[0].exc_info, [r.getMessage() for r in lines]
        assert not tracebacks(caplog.records)
    agents = agent_pb2_grpc.AgentServiceStub(channel)
    await agents.CreateAgent(
        agent_pb2.CreateAgentRequest(workspace_id=WS, agent_id="still-ok"),
        metadata=_as(callers, "AgentService/CreateAgent"),
    )


class _Raw:
    """Bytes that `_unary`'s serializer sends as they are."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def SerializeToString(self) -> bytes:  # noqa: N802 - the protobuf spelling
        return self.data


@pytest.mark.parametrize(
    "data",
    [
        agent_pb2.CreateAgentRequest(workspace_id=WS, agent_id="x", display_name="Ada\x00"),
        _Raw(b"\x0a\x02\xc3\x28"),  # invalid UTF-8 in workspace_id
        _Raw(b"\xff\xff\xff\xff"),
    ],
    ids=["nul", "invalid-utf8", "random-bytes"],
)
async def test_the_credential_is_checked_before_the_request_is_decoded(
    channel: grpc.aio.Channel, callers: Callers, data: Any
) -> None:
    """README and docs/api.md: no credential, or a bad one, is UNAUTHENTICATED, whatever the
    request holds; one whose role may not call the method is PERMISSION_DENIED; only a
    caller who may call it hears what is wrong with the request."""
    method = "/agentrun.v1.AgentService/CreateAgent"
    call = channel.unary_unary(method, lambda m: m.SerializeToString(), bytes)
    real = callers.texts["admin"]
    forged = real[:-1] + ("A" if real[-1] != "A" else "B")
    for metadata in [
        (),
        (("authorization", "Bearer nope"),),
        (("authorization", f"Bearer {forged}"),),
        (("authorization", f"Bearer {callers.revoked}"),),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call(data, timeout=10, metadata=metadata)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value.details()
    reader = (("authorization", f"Bearer {callers.texts['reader']}"),)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call(data, timeout=10, metadata=reader)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call(data, timeout=10, metadata=(("authorization", f"Bearer {real}"),))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def _connect(channel: grpc.aio.Channel, callers: Callers) -> Any:
    return channel.stream_stream(CONNECT, None, executor_pb2.ConnectResponse.FromString)(
        timeout=20, metadata=callers.metadata(CONNECT)
    )


def _frame(**msg: Any) -> bytes:
    return executor_pb2.ConnectRequest(**msg).SerializeToString()


async def test_a_garbage_frame_ends_that_executor_stream_only(
    server: RunningServer,
    channel: grpc.aio.Channel,
    caplog: pytest.LogCaptureFixture,
    callers: Callers,
) -> None:
    good, bad = _connect(channel, callers), _connect(channel, callers)
    for stream, name in ((good, "ex-good"), (bad, "ex-bad")):
        await stream.write(_frame(hello=executor_pb2.Hello(executor_id=name, capacity=1)))
        assert (await stream.read()).HasField("welcome")
    await bad.write(b"\x0a\x05\xff\xfe\xfd\xfc\xfb")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        while True:
            if await bad.read() is grpc.aio.EOF:
                break
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "request is not a valid ConnectRequest"
    # The other executor's stream goes on: a heartbeat is answered, and a commit holding
    # a NUL is refused as that run's commit (a message), not as the end of the stream.
    await good.write(_frame(heartbeat=executor_pb2.Heartbeat(request_id=7)))
    assert (await good.read()).heartbeat_result.request_id == 7
    lease_msg = executor_pb2.Lease(workspace_id=WS, run_id=str(uuid.uuid4()), epoch=1)
    commit = executor_pb2.Commit(
        request_id=8, lease=lease_msg, complete=executor_pb2.Complete(output="done\x00")
    )
    await good.write(_frame(commit=commit))
    result = (await good.read()).commit_result
    assert (result.request_id, result.outcome) == (8, executor_pb2.COMMIT_OUTCOME_INVALID)
    assert "commit.complete.output: contains a NUL character" in result.message
    await good.done_writing()
    assert await good.code() == grpc.StatusCode.OK
    assert not tracebacks(caplog.records)


# --- HTTP ---------------------------------------------------------------------------------


async def test_session_message_nested_100000_deep_is_400_and_stores_nothing(
    server: RunningServer,
    world: dict[str, Any],
    db: Any,
    caplog: pytest.LogCaptureFixture,
    callers: Callers,
) -> None:
    body = ("[" * 100_000 + "]" * 100_000).encode()  # 200 KB, under the body limit
    url = f"http://127.0.0.1:{server.http_port}/v1/workspaces/{WS}/sessions/{world['session_id']}/messages"
    before = await table_counts(db)
    operator = auth.bearer(callers.texts["operator"])
    async with httpx.AsyncClient(timeout=10, headers=operator) as http:
        reply = await http.post(url, content=body, headers={"content-type": "application/json"})
        nul = await http.post(url, content=b'{"text": "hi\\u0000"}')
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"] == "body: is nested deeper than 64 levels"
    assert nul.status_code == 400 and nul.json()["error"] == "body: contains a NUL character"
    # The approval of `world` is notified in the background (its notify URL is down here), and
    # each attempt mints a link token: a write of the relay's, not of these requests.
    assert _but_relay(await table_counts(db)) == _but_relay(before)
    assert not tracebacks(caplog.records)


def _but_relay(counts: dict[str, int]) -> dict[str, int]:
    return {table: n for table, n in counts.items() if table != "approval_tokens"}


async def test_webhook_nested_40000_objects_deep_is_400_and_stores_nothing(
    server: RunningServer, db_url: str, db: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # Setting the trigger up takes an admin key; the deliveries carry only their signature.
    api = await TriggerApi.connect(f"127.0.0.1:{server.port}", db_url, WS)
    try:
        await api.publish("triage")
        secret = await api.webhook("hook", "triage", "hmac_sha256")
    finally:
        await api.close()
    deep = ('{"a":' * 40_000 + "1" + "}" * 40_000).encode()
    nul = b'{"id": "evt_1", "note": "\\u0000"}'
    before = await table_counts(db)
    url = f"http://127.0.0.1:{server.http_port}/hooks/{WS}/hook"
    async with httpx.AsyncClient(timeout=10) as http:
        for n, (body, problem) in enumerate(
            (
                (deep, "body: is nested deeper than 64 levels"),
                (nul, "body: contains a NUL character"),
            )
        ):
            headers = sign(
                "hmac_sha256", secret, body, timestamp=int(time.time()), delivery_id=f"d-{n}"
            )
            headers |= {"content-type": "application/json", "x-webhook-id": f"d-{n}"}
            reply = await http.post(url, content=body, headers=headers)
            assert reply.status_code == 400, reply.text
            assert reply.json()["error"] == problem
    assert await table_counts(db) == before
    assert not tracebacks(caplog.records)


async def test_approval_links_with_a_nul_in_the_path_are_unknown_links(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"http://127.0.0.1:{server.http_port}/approvals/ws%00x/some-token"
    async with httpx.AsyncClient(timeout=10) as http:
        shown = await http.get(url)
        decided = await http.post(url, content=b"decision=approve&reason=ok")
        reason = await http.post(url.replace("%00x", ""), content=b"decision=reject&reason=a%00b")
    assert (shown.status_code, decided.status_code, reason.status_code) == (404, 404, 400)
    assert not tracebacks(caplog.records)
