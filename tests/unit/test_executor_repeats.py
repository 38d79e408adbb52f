"""The repetition guard as a pure function of the step log, and what the run loop commits."""

from __future__ import annotations

import json

from agentrun.v1 import agent_pb2, executor_pb2, run_pb2
from executor import replay, steps, transcript
from executor.models.base import ModelReply, ToolCall
from executor.replay import AwaitPerson, CallModel, HoldRepeat, StartTool
from executor.run_loop import RunDeps, RunLoop
from executor.tools.catalogue import Catalogue
from executor.tools.delivery import Outcome
from tests.unit.test_tool_run_loop import RUN, Committer, Delivery, Leases, payloads

SEARCH = {"name": "search_email", "arguments": {"query": "invoice"}}


def step(seq: int, kind: int, payload: dict, ref_seq: int = 0) -> run_pb2.Step:
    return run_pb2.Step(
        run_id=RUN, seq=seq, kind=kind, ref_seq=ref_seq, payload_json=json.dumps(payload)
    )


def searched(times: int, query: str = "invoice") -> list[run_pb2.Step]:
    """`times` turns, each one search answered ok; the last turn's call is not acted on."""
    log = [step(0, replay.INPUT, {"text": "go"})]
    for n in range(times):
        seq = len(log)
        call = {"id": f"c{n}", "name": "search_email", "arguments": {"query": query}}
        log.append(step(seq, replay.DECISION, {"tool_calls": [call], "usage": {}}))
        if n < times - 1:
            log.append(
                step(seq + 1, replay.STARTED, {"call_id": f"c{n}", "tool": "search_email"}, seq)
            )
            log.append(
                step(
                    seq + 2,
                    replay.RESULT,
                    {"call_id": f"c{n}", "tool": "search_email", "status": "ok", "output": []},
                    seq + 1,
                )
            )
    return log


def test_the_third_identical_call_is_held_and_the_second_is_started():
    assert isinstance(replay.next_action(replay.decode(searched(2)), 3), StartTool)
    action = replay.next_action(replay.decode(searched(3)), 3)
    assert isinstance(action, HoldRepeat)
    assert action.count == 3 and action.earlier == (1, 4)


def test_without_a_limit_nothing_is_held():
    assert isinstance(replay.next_action(replay.decode(searched(5)), 0), StartTool)


def test_different_arguments_are_not_repeats_but_key_order_does_not_matter():
    log = searched(2)
    call = {"id": "cx", "name": "search_email", "arguments": {"query": "other"}}
    log.append(step(7, replay.DECISION, {"tool_calls": [call], "usage": {}}))
    assert isinstance(replay.next_action(replay.decode(log), 3), StartTool)
    a = ToolCall("a", "t", {"x": 1, "y": 2})
    b = ToolCall("b", "t", {"y": 2, "x": 1})
    assert replay.call_signature(a) == replay.call_signature(b)


def test_identical_calls_within_one_decision_count():
    calls = [{"id": f"c{i}", **SEARCH} for i in range(3)]
    log = [step(0, replay.INPUT, {"text": "go"}), step(1, replay.DECISION, {"tool_calls": calls})]
    entries = replay.decode(log)
    # The first two are started in turn (each answered), the third is held.
    assert isinstance(replay.next_action(entries, 3), StartTool)
    entries += [
        replay.Entry(2, replay.STARTED, 1, {"call_id": "c0", "tool": "search_email"}),
        replay.Entry(3, replay.RESULT, 2, {"call_id": "c0", "status": "ok"}),
        replay.Entry(4, replay.STARTED, 1, {"call_id": "c1", "tool": "search_email"}),
        replay.Entry(5, replay.RESULT, 4, {"call_id": "c1", "status": "ok"}),
    ]
    held = replay.next_action(entries, 3)
    assert isinstance(held, HoldRepeat) and held.call.id == "c2"


def held_log() -> list[replay.Entry]:
    """Three searches; the third held (as the run loop commits it) and parked."""
    entries = replay.decode(searched(3))
    action = replay.next_action(entries, 3)
    assert isinstance(action, HoldRepeat)
    return entries + [steps.as_entry(s) for s in steps.repeat_hold(8, action)]


def decision_on(seq: int, ref: int, decision: str) -> replay.Entry:
    payload = {
        "call_id": "c2",
        "tool": "search_email",
        "status": "error",
        "held": "repeat",
        "decision": decision,
        "decided_by": "person:ada",
    }
    return replay.Entry(seq, replay.RESULT, ref, payload)


def test_a_held_repeat_waits_for_a_person_and_shows_the_repeated_call():
    entries = held_log()
    result, park = entries[-2], entries[-1]
    assert result.payload["status"] == "repeated" and result.payload["awaiting"] == "human"
    assert result.payload["repeat"]["count"] == 3
    assert '{"query": "invoice"}' in park.payload["note"]
    assert park.payload["wait_reason"] == "repeat"
    assert isinstance(replay.next_action(entries, 3), AwaitPerson)


def test_a_go_ahead_runs_the_call_and_restarts_the_count():
    entries = [*held_log(), decision_on(10, 8, "retry")]
    action = replay.next_action(entries, 3)
    assert isinstance(action, StartTool) and action.call.id == "c2"
    entries += [
        replay.Entry(11, replay.STARTED, 7, {"call_id": "c2", "tool": "search_email"}),
        replay.Entry(12, replay.RESULT, 11, {"call_id": "c2", "status": "ok", "output": []}),
        replay.Entry(13, replay.DECISION, 0, {"tool_calls": [{"id": "c3", **SEARCH}]}),
    ]
    assert isinstance(replay.next_action(entries, 3), StartTool)  # 1 since the go-ahead


def test_a_refusal_is_answered_and_the_model_reads_it():
    entries = [*held_log(), decision_on(10, 8, "not_happened")]
    assert replay.next_action(entries, 3) == CallModel()
    tool_messages = [m for m in transcript.build_messages(entries, "") if m["role"] == "tool"]
    assert "refused it: it was not run" in tool_messages[-1]["content"]
    # And the next identical call is held again at once: the refused one still counts.
    entries.append(replay.Entry(11, replay.DECISION, 0, {"tool_calls": [{"id": "c9", **SEARCH}]}))
    assert isinstance(replay.next_action(entries, 3), HoldRepeat)


class Model:
    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, model, messages, tools, run_id, seq) -> ModelReply:
        self.calls += 1
        return ModelReply(content="done")


async def test_the_run_loop_commits_the_hold_with_a_repeat_park_and_sends_nothing():
    run = run_pb2.Run(
        run_id=RUN, workspace_id="ws", lease_epoch=1, limits=agent_pb2.RunLimits(repeat_limit=3)
    )
    spec = agent_pb2.AgentSpec(model="m", tools=["search_email"])
    assignment = executor_pb2.Assignment(
        run=run, agent_version=agent_pb2.AgentVersion(spec=spec), steps=searched(3)
    )
    committer, delivery = Committer(), Delivery(Outcome("ok", output=[]))
    deps = RunDeps(committer, Leases(), Model(), delivery, Catalogue.load())  # type: ignore[arg-type]
    assert await RunLoop(assignment, deps).run() == "parked"
    assert delivery.calls == []
    [commit] = committer.commits
    assert commit.park.wait_reason == "repeat" and not commit.park.HasField("wake_after")
    kinds = [kind for kind, _ in payloads(commit)]
    assert kinds == ["tool_result", "park"]
