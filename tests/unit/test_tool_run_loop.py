"""The run loop's side of the classes: what it commits for ok, unknown and pending outcomes.

The loop runs against fakes: a committer that acknowledges and records every
commit, always-safe leases, and a delivery that answers as scripted.
"""

from __future__ import annotations

import json
import random
from typing import Any

from agentrun.v1 import agent_pb2, executor_pb2, run_pb2
from executor import replay
from executor.models.base import ModelReply, ToolCall, Usage
from executor.run_loop import RunDeps, RunLoop
from executor.stream import CommitReply
from executor.tools.catalogue import Catalogue
from executor.tools.delivery import MAX_PENDING_PARKS, Outcome
from tests.harness.run_loop_doubles import Committer, Leases

RUN = "00000000-0000-4000-8000-000000000001"
POST = {"id": "c1", "name": "chat_post", "arguments": {"channel": "#sales", "text": "hi"}}


class Model:
    """Answers every call with a final text, and remembers what it was shown."""

    def __init__(self) -> None:
        self.seen: list[list[dict]] = []

    async def complete(self, model, messages, tools, run_id, seq) -> ModelReply:
        self.seen.append(list(messages))
        return ModelReply(content="done")


class Delivery:
    """Answers `send` and `resolve_unknown` with the next scripted outcome."""

    def __init__(self, *outcomes: Outcome) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[tuple[str, Any]] = []

    async def send(self, tool, arguments, key, guard) -> Outcome:
        self.calls.append(("send", key))
        return self.outcomes.pop(0)

    async def resolve_unknown(self, tool, recorded_class, arguments, key, guard, key_age=0.0):
        self.calls.append(("resolve", key, round(key_age)))
        return self.outcomes.pop(0)


def step(seq: int, kind: int, payload: dict, ref_seq: int = 0, created: int = 0) -> run_pb2.Step:
    msg = run_pb2.Step(
        run_id=RUN, seq=seq, kind=kind, ref_seq=ref_seq, payload_json=json.dumps(payload)
    )
    if created:
        msg.create_time.seconds = created
    return msg


def decided_to_post() -> list[run_pb2.Step]:
    decision = {"content": None, "tool_calls": [POST], "usage": {}, "response_id": "r1"}
    return [step(0, replay.INPUT, {"text": "go"}), step(1, replay.DECISION, decision)]


async def run_once(
    log: list[run_pb2.Step], delivery: Delivery, model: Model | None = None
) -> tuple[str, Committer]:
    committer = Committer()
    assignment = executor_pb2.Assignment(
        run=run_pb2.Run(workspace_id="ws", run_id=RUN, lease_epoch=3),
        agent_version=agent_pb2.AgentVersion(spec=agent_pb2.AgentSpec(tools=["chat_post"])),
        steps=log,
    )
    deps = RunDeps(
        committer=committer,
        leases=Leases(),
        model=model or Model(),
        delivery=delivery,  # type: ignore[arg-type]
        catalogue=Catalogue.load(),
        wall_clock=lambda: 1_000_000.0,
        rng=random.Random(0),
    )
    return await RunLoop(assignment, deps).run(), committer


def payloads(commit: executor_pb2.Commit) -> list[tuple[str, dict]]:
    return [(replay.kind_name(s.kind), json.loads(s.payload_json)) for s in commit.steps]


async def test_an_unknown_outcome_is_committed_with_a_park_for_a_person_in_one_commit():
    ended, committer = await run_once(decided_to_post(), Delivery(Outcome.unknown("lost")))
    assert ended == "parked"
    started, settled = committer.commits
    assert [kind for kind, _ in payloads(started)] == ["tool_started"]
    (result_kind, result), (park_kind, park) = payloads(settled)
    assert (result_kind, result["status"], result["awaiting"]) == (
        "tool_result",
        "unknown",
        "human",
    )
    assert (park_kind, park["wait_reason"]) == ("park", "human")
    assert settled.park.wait_reason == "human" and settled.park.WhichOneof("wake") is None


async def test_a_pending_outcome_parks_to_retry_without_recording_a_result():
    pending = Outcome.pending("key in use", Outcome.unknown("stayed in use"), retry_after=9.0)
    ended, committer = await run_once(decided_to_post(), Delivery(pending))
    assert ended == "parked"
    kinds = [kind for commit in committer.commits for kind, _ in payloads(commit)]
    assert kinds == ["tool_started", "park"]
    park = committer.commits[-1].park
    assert park.wait_reason == "retry" and park.wake_after.ToTimedelta().total_seconds() == 9.0


async def test_on_waking_the_started_call_is_resolved_with_its_key_and_age():
    log = decided_to_post()
    started = {"call_id": "c1", "tool": "chat_post", "arguments": {}, "class": "none"}
    log.append(step(2, replay.STARTED, {**started, "idempotency_key": f"{RUN}:2"}, 1, 999_000))
    delivery, model = Delivery(Outcome("ok", output={"ts": "1"})), Model()
    ended, committer = await run_once(log, delivery, model)
    assert delivery.calls[0] == ("resolve", f"{RUN}:2", 1000)  # 1_000_000 - 999_000 s old
    assert payloads(committer.commits[0])[0][1]["status"] == "ok"
    assert ended == "completed" and model.seen[0][-1]["content"] == '{"ts": "1"}'


async def test_a_pending_outcome_that_parked_too_often_records_its_fallback():
    log = decided_to_post()
    started = {"call_id": "c1", "tool": "chat_post", "arguments": {}, "class": "none"}
    log.append(step(2, replay.STARTED, {**started, "idempotency_key": f"{RUN}:2"}, 1))
    for i in range(MAX_PENDING_PARKS):
        log.append(step(3 + i, replay.PARK, {"wait_reason": "retry", "note": "again"}))
    pending = Outcome.pending("still nothing", Outcome.unknown("gave up"))
    ended, committer = await run_once(log, Delivery(pending))
    assert ended == "parked"
    (result_kind, result), (_, park) = payloads(committer.commits[0])
    assert result["status"] == "unknown" and result["resolution"].startswith("gave up")
    assert park["wait_reason"] == "human"


async def test_a_run_assigned_while_a_person_has_not_decided_parks_again():
    log = decided_to_post()
    started = {"call_id": "c1", "tool": "chat_post", "arguments": {}, "class": "none"}
    log.append(step(2, replay.STARTED, {**started, "idempotency_key": f"{RUN}:2"}, 1))
    unknown = {"call_id": "c1", "tool": "chat_post", "status": "unknown", "awaiting": "human"}
    log.append(step(3, replay.RESULT, unknown, 2))
    delivery = Delivery()
    ended, committer = await run_once(log, delivery)
    assert ended == "parked" and delivery.calls == []
    assert committer.commits[0].park.wait_reason == "human"


async def test_a_decision_to_fail_the_run_fails_it():
    log = decided_to_post()
    started = {"call_id": "c1", "tool": "chat_post", "arguments": {}, "class": "none"}
    log.append(step(2, replay.STARTED, {**started, "idempotency_key": f"{RUN}:2"}, 1))
    unknown = {"call_id": "c1", "tool": "chat_post", "status": "unknown", "awaiting": "human"}
    log.append(step(3, replay.RESULT, unknown, 2))
    log.append(step(4, replay.PARK, {"wait_reason": "human"}))
    decision = {"call_id": "c1", "status": "error", "decision": "fail_run", "decided_by": "bo"}
    log.append(step(5, replay.RESULT, decision, 3))
    ended, committer = await run_once(log, Delivery())
    assert ended == "failed"
    assert (
        committer.commits[0].fail.error
        == "the outcome of chat_post was unknown and bo failed the run"
    )


class RefusingCommitter(Committer):
    """Refuses as INVALID any commit that starts a tool (a stand-in for a bug)."""

    async def commit(self, commit: executor_pb2.Commit, reply_within: float | None = None):
        if any(s.kind == replay.STARTED for s in commit.steps):
            self.commits.append(commit)
            result = executor_pb2.CommitResult(
                outcome=executor_pb2.COMMIT_OUTCOME_INVALID, message="malformed commit: 7"
            )
            return CommitReply(result=result, sent_at=0.0)
        return await super().commit(commit, reply_within)


async def test_a_commit_refused_as_invalid_fails_the_run_instead_of_looping_forever():
    committer = RefusingCommitter()
    assignment = executor_pb2.Assignment(
        run=run_pb2.Run(workspace_id="ws", run_id=RUN, lease_epoch=3),
        agent_version=agent_pb2.AgentVersion(spec=agent_pb2.AgentSpec(tools=["chat_post"])),
        steps=decided_to_post(),
    )
    deps = RunDeps(
        committer=committer,
        leases=Leases(),
        model=Model(),
        delivery=Delivery(),  # type: ignore[arg-type]
        catalogue=Catalogue.load(),
        wall_clock=lambda: 1_000_000.0,
        rng=random.Random(0),
    )
    assert await RunLoop(assignment, deps).run() == "failed"
    last = committer.commits[-1]
    assert last.WhichOneof("transition") == "fail"
    assert "refused as invalid: malformed commit: 7" in last.fail.error


class FailingControlPlane(Committer):
    """Answers as a control plane whose commit transaction keeps failing: it failed the run."""

    async def commit(self, commit: executor_pb2.Commit, reply_within: float | None = None):
        self.commits.append(commit)
        result = executor_pb2.CommitResult(
            outcome=executor_pb2.COMMIT_OUTCOME_FENCED,
            message="the run failed: internal error while committing a step (request 0123)",
        )
        return CommitReply(result=result, sent_at=0.0)


async def test_a_run_the_control_plane_failed_on_a_commit_error_stops_at_once():
    committer, model = FailingControlPlane(), Model()
    assignment = executor_pb2.Assignment(
        run=run_pb2.Run(workspace_id="ws", run_id=RUN, lease_epoch=3),
        agent_version=agent_pb2.AgentVersion(spec=agent_pb2.AgentSpec(tools=["chat_post"])),
        steps=[step(0, replay.INPUT, {"text": "go"})],
    )
    deps = RunDeps(
        committer=committer,
        leases=Leases(),
        model=model,
        delivery=Delivery(),  # type: ignore[arg-type]
        catalogue=Catalogue.load(),
        wall_clock=lambda: 1_000_000.0,
        rng=random.Random(0),
    )
    assert await RunLoop(assignment, deps).run() == "fenced"
    assert len(committer.commits) == 1 and len(model.seen) == 1  # sent once, asked once


class Deciding(Model):
    """Calls the given tools once, then answers with a final text."""

    def __init__(self, *calls: dict) -> None:
        super().__init__()
        self.calls = [ToolCall(c["id"], c["name"], c["arguments"]) for c in calls]

    async def complete(self, model, messages, tools, run_id, seq) -> ModelReply:
        self.seen.append(list(messages))
        if len(self.seen) == 1:
            return ModelReply(content=None, tool_calls=tuple(self.calls), usage=Usage(7, 3))
        return ModelReply(content="done")


async def test_a_decision_that_calls_a_tool_commits_with_the_first_started_in_one_commit():
    delivery = Delivery(Outcome("ok", output={"ts": "1"}), Outcome("ok", output={"ts": "2"}))
    second = {**POST, "id": "c2", "arguments": {"channel": "#ops", "text": "hey"}}
    ended, committer = await run_once(
        [step(0, replay.INPUT, {"text": "go"})], delivery, Deciding(POST, second)
    )
    assert ended == "completed"
    first = committer.commits[0]
    (decision_kind, _), (started_kind, started) = payloads(first)
    assert (decision_kind, started_kind) == ("model_decision", "tool_started")
    assert [s.seq for s in first.steps] == [1, 2] and first.steps[1].ref_seq == 1
    assert (first.model_calls, first.tool_calls, first.tokens) == (1, 1, 10)
    assert started["idempotency_key"] == f"{RUN}:2"
    # The request left after that one commit, under the key it recorded; the second call
    # of the decision is started on its own, as before.
    assert delivery.calls == [("send", f"{RUN}:2"), ("send", f"{RUN}:4")]
    kinds = [[kind for kind, _ in payloads(c)] for c in committer.commits]
    assert kinds == [
        ["model_decision", "tool_started"],
        ["tool_result"],
        ["tool_started"],
        ["tool_result"],
        ["model_decision", "finish"],
    ]


async def test_a_decision_whose_first_call_is_refused_is_committed_alone():
    refused = {"id": "c1", "name": "send_email", "arguments": {"to": "a@b.c"}}  # not the agent's
    delivery = Delivery()
    ended, committer = await run_once(
        [step(0, replay.INPUT, {"text": "go"})], delivery, Deciding(refused)
    )
    assert ended == "completed" and delivery.calls == []
    kinds = [[kind for kind, _ in payloads(c)] for c in committer.commits]
    assert kinds[:2] == [["model_decision"], ["tool_result"]]
    assert payloads(committer.commits[1])[0][1]["status"] == "error"
