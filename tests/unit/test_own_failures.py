"""Our own failures are never a tool's outcome: each place where the platform (not the
provider) kept a request from leaving hands the run back, the call left `started` and,
where it is known never to have left, marked so the next holder sends it under its key.

The run loop drives the real ToolDelivery here; the provider is a client double that
records what it was asked to send, and the lease keeper a double that says what the
stream and the lease allow.
"""

from __future__ import annotations

import json
import random
from typing import Any

import grpc
import pytest

from agentrun.v1 import agent_pb2, executor_pb2, executor_pb2_grpc, run_pb2
from executor import replay
from executor.horizon import SEND_GATE, SESSION_GONE, Refused
from executor.lease import LEASE_UNSAFE
from executor.models.base import ModelReply, ToolCall
from executor.run_loop import RunDeps, RunLoop
from executor.stream import ControlPlaneStream
from executor.tools.catalogue import Catalogue
from executor.tools.credentials import ConnectionUnusable
from executor.tools.delivery import Outcome, ToolDelivery
from executor.tools.mcp_call import call_mcp
from executor.tools.send_errors import MaybeSent
from tests.harness.http_stub import Reply, Seen, serving
from tests.harness.run_loop_doubles import Committer, Leases

RUN = "00000000-0000-4000-8000-000000000039"
EPOCH = 7
CHAT = {"id": "c1", "name": "chat_post", "arguments": {"channel": "#sales", "text": "hi"}}
UPSERT = {
    "id": "c1",
    "name": "crm_upsert",
    "arguments": {"email": "ada@example.com", "name": "Ada", "stage": "lead"},
}


class Provider:
    """The tool client: answers each send in turn (an exception is raised), records keys."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.sent: list[str] = []

    async def send(self, tool, arguments, key, credential=None) -> Any:
        self.sent.append(key)
        answer = self.answers.pop(0) if self.answers else {"ok": True}
        if isinstance(answer, Exception):
            raise answer
        return answer


class Gone(Leases):
    """A lease carried over a reconnect after the loop's own check, or one that became
    unsafe: from the `refuse_from`-th request (model or tool) on, the guard refuses for
    `why`; from the `carried_from`-th on (None: never), the loop sees it carried over."""

    def __init__(
        self, why: str = SESSION_GONE, refuse_from: int = 1, carried_from: int | None = None
    ) -> None:
        self.why, self.refuse_from, self.carried_from, self.asked = (
            why,
            refuse_from,
            carried_from,
            0,
        )

    def carried_over(self, run_id: str) -> bool:
        return self.carried_from is not None and self.asked >= self.carried_from

    async def wait_to_send(self, run_id: str) -> str | None:
        self.asked += 1
        return self.why if self.asked >= self.refuse_from else None


class Model:
    """Calls the tool once (if given one), then answers."""

    def __init__(self, call: dict[str, Any] | None) -> None:
        self.call = call

    async def complete(self, model, messages, tools, run_id, seq) -> ModelReply:
        if self.call is None:
            return ModelReply(content="done", response_id="r2")
        call = ToolCall(self.call["id"], self.call["name"], self.call["arguments"])
        self.call = None
        return ModelReply(content=None, tool_calls=(call,), response_id="r1")


def step(seq: int, kind: int, payload: dict, ref_seq: int = 0) -> run_pb2.Step:
    return run_pb2.Step(
        run_id=RUN, seq=seq, kind=kind, ref_seq=ref_seq, payload_json=json.dumps(payload)
    )


def decided(call: dict[str, Any]) -> list[run_pb2.Step]:
    decision = {"content": None, "tool_calls": [call], "usage": {}, "response_id": "r1"}
    return [step(0, replay.INPUT, {"text": "go"}), step(1, replay.DECISION, decision)]


def started(call: dict[str, Any], call_class: str, *parks: dict[str, Any]) -> list[run_pb2.Step]:
    begun = {
        "call_id": call["id"],
        "tool": call["name"],
        "arguments": call["arguments"],
        "idempotency_key": f"{RUN}:2",
        "class": call_class,
    }
    log = [*decided(call), step(2, replay.STARTED, begun, 1)]
    return log + [step(3 + i, replay.PARK, park) for i, park in enumerate(parks)]


def handoff(epoch: int | None = None) -> dict[str, Any]:
    park = {"wait_reason": "handoff", "wake_after_seconds": 0, "note": "handed back"}
    return park | ({"unsent_call_seq": 2, "epoch": epoch} if epoch is not None else {})


async def run_once(
    log: list[run_pb2.Step],
    leases: Leases,
    *,
    provider: Provider | None = None,
    delivery: Any = None,
    model: Model | None = None,
    tools: tuple[str, ...] = ("chat_post",),
) -> tuple[str, list[list[tuple[str, dict[str, Any]]]]]:
    """Run the loop once; how it ended, and each commit's (kind, payload) steps."""
    committer = Committer()
    run = run_pb2.Run(workspace_id="ws", run_id=RUN, lease_epoch=EPOCH)
    spec = agent_pb2.AgentSpec(tools=list(tools))
    assignment = executor_pb2.Assignment(
        run=run, agent_version=agent_pb2.AgentVersion(spec=spec), steps=log
    )
    delivery = delivery or ToolDelivery(provider or Provider(), sleep=_no_wait)  # type: ignore[arg-type]
    deps = RunDeps(
        committer=committer,
        leases=leases,
        model=model or Model(CHAT),  # type: ignore[arg-type]
        delivery=delivery,
        catalogue=Catalogue.load(),
        rng=random.Random(0),
    )
    ended = await RunLoop(assignment, deps).run()
    commits = [
        [(replay.kind_name(s.kind), json.loads(s.payload_json)) for s in c.steps]
        for c in committer.commits
    ]
    return ended, commits


async def _no_wait(seconds: float) -> None:
    return None


def _results(commits: list[list[tuple[str, dict[str, Any]]]]) -> list[dict[str, Any]]:
    return [payload for commit in commits for kind, payload in commit if kind == "tool_result"]


@pytest.mark.parametrize("why", [SESSION_GONE, LEASE_UNSAFE], ids=["stream-gone", "lease-unsafe"])
async def test_a_call_the_lease_may_no_longer_send_is_handed_back_known_unsent(why: str):
    """The guard refused (the stream that granted the lease went between the loop's check
    and the send, or the lease got too close to expiry): not an error result, not a
    silent stop that leaves a `none` call for a person, but a handoff saying it never left."""
    provider = Provider()
    ended, commits = await run_once(decided(CHAT), Gone(why), provider=provider)
    assert provider.sent == []
    assert _results(commits) == []
    assert [[k for k, _ in c] for c in commits] == [["tool_started"], ["park"]]
    ((_, park),) = commits[1]
    assert ended == "parked" and park["wait_reason"] == "handoff"
    assert (park["unsent_call_seq"], park["epoch"]) == (2, EPOCH)


async def test_a_refusal_after_a_request_that_may_have_left_hands_back_unmarked():
    """A provider_key write timed out (it may have been applied), and the resend was held
    back on our side: handed back, but not as unsent; the next holder resolves it by class."""
    provider = Provider(MaybeSent("no response from crm: ServerTimeoutError"))
    ended, commits = await run_once(
        decided(UPSERT),
        Gone(refuse_from=2),
        provider=provider,
        model=Model(UPSERT),
        tools=("crm_upsert",),
    )
    assert provider.sent == [f"{RUN}:2"] and _results(commits) == []
    ((_, park),) = commits[-1]
    assert ended == "parked" and park["wait_reason"] == "handoff"
    assert "unsent_call_seq" not in park


async def test_a_held_back_call_is_sent_by_the_next_holder_whatever_its_class():
    provider = Provider({"ok": True, "ts": "1"})
    ended, commits = await run_once(
        started(CHAT, "none", handoff(EPOCH - 1)), Leases(), provider=provider, model=Model(None)
    )
    assert provider.sent == [f"{RUN}:2"]
    (result,) = _results(commits)
    assert result["status"] == "ok" and ended == "completed"


async def test_a_carried_over_lease_hands_back_a_known_unsent_call_still_marked():
    """Resuming a call known unsent, the lease came over a reconnect before it could be
    sent: the handoff carries the mark on, or the next holder would have to ask a person."""
    provider = Provider()
    ended, commits = await run_once(
        started(CHAT, "none", handoff(EPOCH - 1)), Gone(carried_from=0), provider=provider
    )
    ((kind, park),) = commits[0]
    assert provider.sent == [] and ended == "parked"
    assert (kind, park["wait_reason"], park["unsent_call_seq"], park["epoch"]) == (
        "park",
        "handoff",
        2,
        EPOCH,
    )


async def test_a_decision_on_a_carried_over_lease_starts_no_call_ahead():
    """The decision that calls a tool is committed alone when the lease came over a
    reconnect (the loop would hand back before starting it): nothing started, nothing to
    settle, nothing sent."""
    provider = Provider()
    # The model is asked on the lease's own stream, which is replaced while it answers.
    leases = Gone(refuse_from=2, carried_from=1)
    ended, commits = await run_once(
        [step(0, replay.INPUT, {"text": "go"})], leases, provider=provider
    )
    assert [[k for k, _ in c] for c in commits] == [["model_decision"], ["park"]]
    assert provider.sent == [] and commits[1][0][1]["wait_reason"] == "handoff"


async def test_handed_back_again_and_again_the_run_waits_before_each_claim():
    parks = [handoff(), handoff(), handoff()]
    ended, commits = await run_once(started(CHAT, "none", *parks), Gone(carried_from=0))
    ((_, park),) = commits[0]
    assert park["wait_reason"] == "handoff" and park["wake_after_seconds"] == 1.0


class Delivery:
    """A delivery whose resolution of an unknown raises `error`."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def resolve_unknown(self, *args: Any, **kwargs: Any) -> Outcome:
        raise self.error


async def test_a_connection_refused_while_resolving_an_unknown_does_not_mark_it_unsent():
    """An e-mail (lookup class) started before a crash may have gone out; its connection is
    refused while it is looked up. The park must not say it never left, or the next holder
    would send it without looking it up first."""
    mail = {
        "id": "c1",
        "name": "send_email",
        "arguments": {"to": "ada@example.com", "subject": "hi", "body": "hello"},
    }
    refused = ConnectionUnusable("conn-1", "is unusable: revoked")
    ended, commits = await run_once(
        started(mail, "lookup"), Leases(), delivery=Delivery(refused), tools=("send_email",)
    )
    ((kind, park),) = commits[0]
    assert (kind, park["wait_reason"], ended) == ("park", "connection", "parked")
    assert "unsent_call_seq" not in park


async def test_a_token_the_control_plane_cannot_give_is_our_failure_not_the_tools():
    lease = executor_pb2.Lease(workspace_id="ws", run_id=RUN, epoch=EPOCH)
    stream = ControlPlaneStream("127.0.0.1:1", executor_pb2.Hello, handler=None)  # type: ignore[arg-type]
    with pytest.raises(Refused, match="no channel"):
        await stream.connection_token(lease, "conn-1")
    async with grpc.aio.insecure_channel("127.0.0.1:1") as channel:  # nothing listens there
        stream._stub = executor_pb2_grpc.ExecutorServiceStub(channel)
        with pytest.raises(Refused, match="connection token unavailable: UNAVAILABLE"):
            await stream.connection_token(lease, "conn-1")


def _mcp_server(seen: Seen) -> Reply:
    """A sound MCP server: initialize, tools/list, tools/call."""
    if seen.method != "POST":
        return Reply(405)
    request = json.loads(seen.body)
    if "id" not in request:
        return Reply(202)
    method = request["method"]
    results = {
        "initialize": {
            "protocolVersion": "2025-06-18",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "t", "version": "1"},
        },
        "tools/list": {"tools": [{"name": "note", "inputSchema": {"type": "object"}}]},
        "tools/call": {"content": [{"type": "text", "text": '{"ok": true}'}]},
    }
    if method not in results:
        error = {"code": -32601, "message": "Method not found"}
        body = {"jsonrpc": "2.0", "id": request["id"], "error": error}
    else:
        body = {"jsonrpc": "2.0", "id": request["id"], "result": results[method]}
    return Reply(200, json.dumps(body).encode(), {"Content-Type": "application/json"})


async def test_an_mcp_call_held_back_at_the_last_moment_is_refused_not_a_send_error():
    async with serving(_mcp_server) as server:
        SEND_GATE.set(lambda: SESSION_GONE)
        try:
            with pytest.raises(Refused, match="not sent"):
                await call_mcp(f"{server.url}/mcp", "note", {"text": "hi"})
        finally:
            SEND_GATE.set(None)
        assert not any(b'"tools/call"' in s.body for s in server.seen)
