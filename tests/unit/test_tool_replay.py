"""Replaying unknown outcomes and people's decisions on them: what the run does next."""

from __future__ import annotations

import json

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from agentrun.v1 import run_pb2
from executor import replay, steps, transcript
from executor.replay import AwaitPerson, CallModel, FailRun, ResolveUnknown, StartTool

RUN = "run-1"
POST = {"id": "c1", "name": "chat_post", "arguments": {"channel": "#sales", "text": "hi"}}
ECHO = {"id": "c2", "name": "echo", "arguments": {"text": "after"}}


def step(seq: int, kind: int, payload: dict, ref_seq: int = 0) -> run_pb2.Step:
    return run_pb2.Step(
        run_id=RUN, seq=seq, kind=kind, ref_seq=ref_seq, payload_json=json.dumps(payload)
    )


def log_until_unknown(*calls: dict) -> list[run_pb2.Step]:
    """input, a decision with `calls`, the first one started, its outcome unknown, a park."""
    decision = {"content": None, "tool_calls": list(calls), "usage": {}, "response_id": "r1"}
    started = {
        "call_id": "c1",
        "tool": "chat_post",
        "arguments": POST["arguments"],
        "idempotency_key": f"{RUN}:2",
        "class": "none",
    }
    unknown = steps.as_entry(
        steps.tool_result(3, 2, "c1", "chat_post", "unknown", resolution="not retried")
    )
    return [
        step(0, replay.INPUT, {"text": "announce it"}),
        step(1, replay.DECISION, decision),
        step(2, replay.STARTED, started, ref_seq=1),
        step(3, replay.RESULT, dict(unknown.payload), ref_seq=2),
        step(4, replay.PARK, {"wait_reason": "human", "note": "waiting"}),
    ]


def decided(seq: int, decision: str, note: str = "", unknown_seq: int = 3) -> run_pb2.Step:
    payload = {
        "call_id": "c1",
        "tool": "chat_post",
        "output": None,
        "decision": decision,
        "status": "ok" if decision == "happened" else "error",
        "decided_by": "alice",
        "resolution": f"{decision} (alice)",
        **({"note": note} if note else {}),
    }
    return step(seq, replay.RESULT, payload, ref_seq=unknown_seq)


def test_an_unknown_outcome_is_recorded_as_awaiting_a_person():
    unknown = steps.as_entry(steps.tool_result(3, 2, "c1", "chat_post", "unknown"))
    assert unknown.payload["awaiting"] == "human" and unknown.awaits_person
    answered = steps.as_entry(steps.tool_result(3, 2, "c1", "chat_post", "ok"))
    assert "awaiting" not in answered.payload and not answered.awaits_person


def test_a_run_assigned_before_the_decision_keeps_waiting():
    action = replay.next_action(replay.decode(log_until_unknown(POST)))
    assert isinstance(action, AwaitPerson) and action.result.seq == 3


def test_it_happened_answers_the_call_and_the_model_reads_who_said_so():
    entries = replay.decode([*log_until_unknown(POST), decided(5, "happened", "seen in #sales")])
    assert replay.next_action(entries) == CallModel()
    tool_message = transcript.build_messages(entries, "")[-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "c1"
    assert "alice checked and decided: it happened" in tool_message["content"]
    assert "seen in #sales" in tool_message["content"]


def test_it_did_not_happen_answers_the_call_without_sending_it_again():
    entries = replay.decode([*log_until_unknown(POST), decided(5, "not_happened")])
    assert replay.next_action(entries) == CallModel()
    assert "it did not happen" in transcript.build_messages(entries, "")[-1]["content"]


def test_retry_starts_the_same_call_again_and_its_new_result_is_what_the_model_reads():
    log = [*log_until_unknown(POST), decided(5, "retry")]
    action = replay.next_action(replay.decode(log))
    assert isinstance(action, StartTool) and (action.decision_seq, action.call.id) == (1, "c1")
    retried = {"call_id": "c1", "tool": "chat_post", "arguments": {}, "class": "none"}
    log.append(step(6, replay.STARTED, {**retried, "idempotency_key": f"{RUN}:6"}, ref_seq=1))
    assert replay.next_action(replay.decode(log)) == ResolveUnknown(replay.decode(log)[-1])
    log.append(step(7, replay.RESULT, {"call_id": "c1", "status": "ok", "output": {"ts": "9"}}, 6))
    entries = replay.decode(log)
    assert replay.next_action(entries) == CallModel()
    assert transcript.build_messages(entries, "")[-1]["content"] == '{"ts": "9"}'
    assert replay.counters(entries).tool_calls == 2


def test_fail_run_fails_it_saying_who_and_why():
    entries = replay.decode([*log_until_unknown(POST), decided(5, "fail_run", "wrong channel")])
    action = replay.next_action(entries)
    assert isinstance(action, FailRun)
    assert action.error == (
        "the outcome of chat_post was unknown and alice failed the run: wrong channel"
    )


def test_after_a_decision_the_next_call_of_the_same_decision_starts():
    entries = replay.decode([*log_until_unknown(POST, ECHO), decided(5, "happened")])
    action = replay.next_action(entries)
    assert isinstance(action, StartTool) and action.call.id == "c2"


@pytest.mark.parametrize("status", ["unknown", "ok"])
def test_results_from_before_people_decided_count_as_answered(status):
    """Logs written before unknowns waited for a person: an unknown result was final."""
    log = log_until_unknown(POST)[:3]
    log.append(step(3, replay.RESULT, {"call_id": "c1", "tool": "chat_post", "status": status}, 2))
    assert replay.next_action(replay.decode(log)) == CallModel()


def test_the_database_time_of_each_step_is_kept_for_key_expiry():
    created = Timestamp(seconds=1_700_000_000, nanos=500_000_000)
    with_time = run_pb2.Step(seq=2, kind=replay.STARTED, payload_json="{}", create_time=created)
    without = run_pb2.Step(seq=3, kind=replay.RESULT, payload_json="{}")
    entries = replay.decode([with_time, without])
    assert entries[0].created_at == 1_700_000_000.5 and entries[1].created_at is None


def test_a_park_for_a_person_has_no_wake_time():
    park = steps.park_transition("human", None)
    assert park.wait_reason == "human" and park.WhichOneof("wake") is None
    payload = json.loads(steps.park(4, "human", None, "waiting").payload_json)
    assert payload == {"wait_reason": "human", "note": "waiting"}
