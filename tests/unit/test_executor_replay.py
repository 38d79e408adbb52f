"""Rebuilding a run from its step log: next action, next seq and the model's messages."""

from __future__ import annotations

import json
import random

from agentrun.v1 import agent_pb2, run_pb2
from executor import context, limits, replay, steps, transcript
from executor.approval import canonical_json
from executor.models.base import ModelReply, ToolCall, Usage
from executor.replay import CallModel, Done, FinishCompleted, ResolveUnknown, StartTool
from executor.run_loop import model_backoff

RUN = "run-1"


def step(seq: int, kind: int, payload: dict, ref_seq: int = 0) -> run_pb2.Step:
    return run_pb2.Step(
        run_id=RUN, seq=seq, kind=kind, ref_seq=ref_seq, payload_json=json.dumps(payload)
    )


def input_step(text: str = "find bob") -> run_pb2.Step:
    return step(0, replay.INPUT, {"text": text})


def decision(seq: int, calls: list[dict], content: str | None = None) -> run_pb2.Step:
    payload = {
        "content": content,
        "tool_calls": calls,
        "usage": {"prompt_tokens": 10, "completion_tokens": 5},
        "model": "m",
        "response_id": f"r{seq}",
    }
    return step(seq, replay.DECISION, payload)


def started(seq: int, decision_seq: int, call_id: str, tool: str, cls: str, **args) -> run_pb2.Step:
    payload = {
        "call_id": call_id,
        "tool": tool,
        "arguments": args,
        "idempotency_key": f"{RUN}:{seq}",
        "class": cls,
    }
    return step(seq, replay.STARTED, payload, ref_seq=decision_seq)


def result(seq: int, ref: int, call_id: str, tool: str, status: str, **extra) -> run_pb2.Step:
    payload = {"call_id": call_id, "tool": tool, "status": status, "output": None, **extra}
    return step(seq, replay.RESULT, payload, ref_seq=ref)


CRM = {"id": "c1", "name": "crm_lookup", "arguments": {"email": "bob@example.com"}}
MAIL = {"id": "c2", "name": "send_email", "arguments": {"to": "bob@example.com"}}


def test_fresh_run_calls_the_model_next_at_seq_1():
    entries = replay.decode([input_step()])
    assert replay.next_action(entries) == CallModel()
    assert replay.next_seq(entries) == 1
    assert replay.next_seq([]) == 0


def test_decision_with_two_calls_first_answered_starts_the_second():
    log = [
        input_step(),
        decision(1, [CRM, MAIL]),
        started(2, 1, "c1", "crm_lookup", "read", email="bob@example.com"),
        result(3, 2, "c1", "crm_lookup", "ok", output={"name": "Bob"}),
    ]
    action = replay.next_action(replay.decode(log))
    assert isinstance(action, StartTool)
    assert action.decision_seq == 1
    assert action.call == ToolCall("c2", "send_email", {"to": "bob@example.com"})


def test_first_call_of_a_decision_starts_first():
    action = replay.next_action(replay.decode([input_step(), decision(1, [CRM, MAIL])]))
    assert isinstance(action, StartTool) and action.call.id == "c1"


def test_started_without_result_is_an_unknown_outcome():
    log = [input_step(), decision(1, [MAIL]), started(2, 1, "c2", "send_email", "none")]
    action = replay.next_action(replay.decode(log))
    assert isinstance(action, ResolveUnknown)
    assert action.started.seq == 2
    assert action.call_class == "none"
    assert action.started.payload["idempotency_key"] == f"{RUN}:2"


def test_decision_without_tool_calls_finishes_with_its_content():
    log = [input_step(), decision(1, [], content="Bob is a customer.")]
    assert replay.next_action(replay.decode(log)) == FinishCompleted("Bob is a customer.")


def test_finished_log_is_done():
    log = [
        input_step(),
        decision(1, [], content="hi"),
        step(2, replay.FINISH, {"status": "completed", "output": "hi"}),
    ]
    assert replay.next_action(replay.decode(log)) == Done("completed")


def test_every_call_answered_calls_the_model_again():
    log = [
        input_step(),
        decision(1, [CRM]),
        started(2, 1, "c1", "crm_lookup", "read"),
        result(3, 2, "c1", "crm_lookup", "ok", output={}),
    ]
    assert replay.next_action(replay.decode(log)) == CallModel()


def test_rejected_call_answered_from_the_decision_counts_as_answered():
    unknown_tool = {"id": "c9", "name": "wire_money", "arguments": {}}
    log = [
        input_step(),
        decision(1, [unknown_tool]),
        result(2, 1, "c9", "wire_money", "error", error="unknown tool"),
    ]
    assert replay.next_action(replay.decode(log)) == CallModel()


def test_sleep_started_without_result_is_resolved_when_the_run_wakes():
    sleep = {"id": "s1", "name": "sleep", "arguments": {"seconds": 5}}
    log = [
        input_step(),
        decision(1, [sleep]),
        started(2, 1, "s1", "sleep", "internal", seconds=5),
        step(3, replay.PARK, {"wait_reason": "sleep", "wake_after_seconds": 5, "note": ""}),
    ]
    entries = replay.decode(log)
    action = replay.next_action(entries)
    assert isinstance(action, ResolveUnknown) and action.call_class == "internal"
    assert replay.next_seq(entries) == 4
    entries.append(
        steps.as_entry(steps.tool_result(4, 2, "s1", "sleep", "ok", output={"slept_seconds": 5}))
    )
    assert replay.next_action(entries) == CallModel()


def test_next_seq_follows_the_highest_seq_whatever_the_order_received():
    log = [decision(1, [CRM]), input_step(), started(2, 1, "c1", "crm_lookup", "read")]
    entries = replay.decode(log)
    assert [e.seq for e in entries] == [0, 1, 2]
    assert replay.next_seq(entries) == 3


def test_messages_rebuild_the_conversation_from_recorded_outputs():
    bad_args = {"id": "c3", "name": "echo", "arguments_raw": "{oops"}
    log = [
        input_step("email bob"),
        decision(1, [CRM, MAIL, bad_args], content="Looking up."),
        started(2, 1, "c1", "crm_lookup", "read", email="bob@example.com"),
        result(3, 2, "c1", "crm_lookup", "ok", output={"name": "Bob"}),
        started(4, 1, "c2", "send_email", "none", to="bob@example.com"),
        result(5, 4, "c2", "send_email", "unknown", resolution="not retried: no key"),
        result(6, 1, "c3", "echo", "error", error="arguments are not valid JSON"),
        decision(7, [], content="Done."),
    ]
    messages = transcript.build_messages(replay.decode(log), "You are helpful.")
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "tool",
        "assistant",
    ]
    assert messages[0]["content"] == "You are helpful."
    assert messages[1]["content"] == "email bob"
    assistant = messages[2]
    assert assistant["content"] == "Looking up."
    assert [c["id"] for c in assistant["tool_calls"]] == ["c1", "c2", "c3"]
    first = assistant["tool_calls"][0]
    assert first["type"] == "function"
    assert first["function"]["name"] == "crm_lookup"
    assert json.loads(first["function"]["arguments"]) == {"email": "bob@example.com"}
    assert assistant["tool_calls"][2]["function"]["arguments"] == "{oops"
    assert [m["tool_call_id"] for m in messages[3:6]] == ["c1", "c2", "c3"]
    assert json.loads(messages[3]["content"]) == {"name": "Bob"}
    assert messages[4]["content"].startswith("unknown outcome:")
    assert "may or may not have reached send_email" in messages[4]["content"]
    assert "not retried" in messages[4]["content"]
    assert messages[5]["content"] == "error: arguments are not valid JSON"
    assert messages[6] == {"role": "assistant", "content": "Done."}


def _growing_log(rng: random.Random) -> list[run_pb2.Step]:
    """A run's log as it grows: turns of one to three calls, each started then answered
    (ok, error, unknown), an approval now and then, a summary once, a final answer."""
    log, seq = [input_step("go")], 1
    for turn in range(rng.randint(3, 12)):
        calls = [
            {"id": f"t{turn}c{i}", "name": "echo", "arguments": {"text": f"{turn}.{i}"}}
            for i in range(rng.randint(1, 3))
        ]
        log.append(decision(seq, calls, content=f"turn {turn}"))
        d, seq = seq, seq + 1
        for call in calls:
            log.append(started(seq, d, call["id"], "echo", "read", text="x"))
            seq += 1
            status = rng.choice(["ok", "ok", "error", "unknown"])
            extra = {"output": {"echo": call["id"]}} if status == "ok" else {"error": "boom"}
            log.append(result(seq, d, call["id"], "echo", status, **extra))
            seq += 1
        if turn == 2 and rng.random() < 0.5:
            text = {"text": "recap", "from_seq": 1, "through_seq": d, "turns": 2}
            log.append(step(seq, replay.SUMMARY, text))
            seq += 1
    log.append(decision(seq, [], content="done"))
    return log


def test_rendered_turns_give_the_same_messages_as_rendering_afresh_as_the_log_grows():
    """The run loop keeps its turns' rendered messages between model calls: at every length
    of a growing log (the same Entry objects, one more each time, as a held run's), the
    messages are those rendered from nothing, a turn is rendered again when a step joins
    it, and one whose steps did not change is not."""
    for trial in range(40):
        log = replay.decode(_growing_log(random.Random(trial)))
        rendered = transcript.RenderedTurns()
        before: dict[int, list[dict]] = {}
        for n in range(1, len(log) + 1):
            entries = log[:n]
            cached = transcript.build_messages(entries, "be brief", rendered)
            assert cached == transcript.build_messages(entries, "be brief")
            # The context check's size, added up from the kept turns' measured lengths:
            # to the character, and so to the token.
            chars = sum(rendered.chars(m) for m in cached) + max(len(cached) - 1, 0) + 2
            assert chars == len(canonical_json(cached))
            tools = [{"type": "function", "function": {"name": "echo", "parameters": {}}}]
            whole = -(
                -len(canonical_json(tools) + canonical_json(cached)) // context.CHARS_PER_TOKEN
            )
            assert context.estimate_tokens(cached, tools, rendered) == whole
            assert context.estimate_tokens(cached, tools) == whole
            turns = {t.decision.seq: t for t in replay._turns(entries)}
            newest = log[n - 1].seq
            for seq, turn in turns.items():
                got = rendered.messages(turn)
                joined = newest == seq or any(
                    e.seq == newest for h in turn.steps.values() for e in h
                )
                if seq in before and not joined:
                    assert got is before[seq]  # unchanged: not rendered again
                before[seq] = got
    # A step joining a turn renders it again: its call's result replaces "no result".
    answered = [
        input_step(),
        decision(1, [CRM]),
        started(2, 1, "c1", "crm_lookup", "read", email="bob@example.com"),
        result(3, 2, "c1", "crm_lookup", "ok", output={"name": "Bob"}),
    ]
    log = replay.decode(answered)
    rendered = transcript.RenderedTurns()
    early = transcript.build_messages(log[:3], "", rendered)
    assert early[-1]["content"].startswith("no result recorded")
    late = transcript.build_messages(log, "", rendered)
    assert json.loads(late[-1]["content"]) == {"name": "Bob"}
    # The same log decoded again (new entries) renders afresh, to the same messages.
    fresh = transcript.build_messages(replay.decode(answered), "", rendered)
    assert fresh == late and fresh[-1] is not late[-1]


def test_a_call_never_answered_still_gets_one_tool_message():
    log = [
        input_step(),
        decision(1, [CRM]),
        started(2, 1, "c1", "crm_lookup", "read"),
        decision(3, [], content="moving on"),
    ]
    messages = transcript.build_messages(replay.decode(log), "")
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[2]["tool_call_id"] == "c1"
    assert "no result recorded" in messages[2]["content"]


def test_unknown_outcome_text_without_resolution_says_it_was_not_retried():
    text = transcript.result_text({"status": "unknown", "tool": "send_email"})
    assert text == (
        "unknown outcome: the request may or may not have reached send_email; it was not retried"
    )


def test_counters_and_trailing_model_parks():
    park = {"wait_reason": "model", "wake_after_seconds": 1, "note": "503"}
    log = [
        input_step(),
        decision(1, [CRM]),
        started(2, 1, "c1", "crm_lookup", "read"),
        result(3, 2, "c1", "crm_lookup", "ok"),
        step(4, replay.PARK, park),
        step(5, replay.PARK, park),
    ]
    entries = replay.decode(log)
    assert replay.counters(entries) == replay.Counters(model_calls=1, tool_calls=1, tokens=15)
    assert replay.trailing_parks(entries, "model") == 2
    assert replay.trailing_parks(entries[:4], "model") == 0


def test_model_backoff_grows_caps_and_honours_retry_after():
    rng = random.Random(1)
    assert 0.5 <= model_backoff(0, None, rng) <= 1.0
    assert 4.0 <= model_backoff(3, None, rng) <= 8.0
    assert model_backoff(20, None, rng) <= 60.0
    assert model_backoff(0, 30.0, rng) == 30.0


def _run(**limit_fields) -> run_pb2.Run:
    return run_pb2.Run(run_id=RUN, limits=agent_pb2.RunLimits(**limit_fields))


def test_limits_fail_the_run_before_the_action_that_would_exceed_them():
    used = replay.Counters(model_calls=3, tool_calls=2, tokens=100)
    call = StartTool(1, ToolCall("c", "echo", {}))
    assert limits.exceeded(_run(max_steps=3), used, CallModel(), 0) == "max_steps exceeded (3)"
    assert limits.exceeded(_run(max_steps=4), used, CallModel(), 0) is None
    assert limits.exceeded(_run(max_steps=3), used, call, 0) is None
    assert limits.exceeded(_run(max_tool_calls=2), used, call, 0) == "max_tool_calls exceeded (2)"
    assert limits.exceeded(_run(max_tokens=100), used, CallModel(), 0) == (
        "max_tokens exceeded (100)"
    )
    assert limits.exceeded(_run(), used, CallModel(), 0) is None


def test_deadline_counts_active_time_not_the_wall_clock():
    run = _run()
    run.limits.deadline.FromSeconds(60)
    run.active_duration.FromSeconds(50)  # earlier holds
    used = replay.Counters()
    assert limits.exceeded(run, used, CallModel(), 10**9, held_for=9.9) is None  # days later
    assert limits.exceeded(run, used, CallModel(), 0, held_for=10.0).startswith(
        "deadline exceeded (60.0s of active time"
    )
    unknown = ResolveUnknown(replay.Entry(2, replay.STARTED, 1, {}))
    assert limits.exceeded(run, used, unknown, 0, held_for=100.0) is None


def test_max_age_is_compared_with_the_wall_clock():
    run = _run()
    run.expire_time.FromSeconds(1_000)
    assert limits.exceeded(run, replay.Counters(), CallModel(), 999.0) is None
    assert limits.exceeded(run, replay.Counters(), CallModel(), 1_000.0).startswith(
        "max age exceeded"
    )


def test_decision_step_payload_and_unique_call_ids():
    calls = (
        ToolCall("", "echo", {"text": "a"}),
        ToolCall("x", "echo", None, "{bad"),
        ToolCall("x", "echo", {"text": "b"}),
    )
    fixed = steps.unique_call_ids(calls, 7)
    assert [c.id for c in fixed] == ["call_7_0", "x", "call_7_2"]
    reply = ModelReply("hi", fixed, Usage(3, 4), "resp-1", "")
    payload = json.loads(steps.decision(7, reply, "llama").payload_json)
    assert payload["model"] == "llama"
    assert payload["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 4,
        "cached_tokens": 0,
        "reasoning_tokens": 0,
        "cache_write_tokens": 0,
    }
    assert payload["tool_calls"][1] == {"id": "x", "name": "echo", "arguments_raw": "{bad"}
    assert payload["tool_calls"][0]["arguments"] == {"text": "a"}


def test_tool_started_carries_the_key_of_its_own_seq():
    step_ = steps.tool_started(5, 4, "c1", "send_email", {"to": "a"}, RUN, "none")
    assert step_.ref_seq == 4
    assert json.loads(step_.payload_json)["idempotency_key"] == f"{RUN}:5"


def test_park_transition_carries_wake_after():
    park = steps.park_transition("sleep", 1.5)
    assert park.wait_reason == "sleep"
    assert park.wake_after.ToMilliseconds() == 1500


def test_a_completion_after_refused_calls_says_so_unless_the_answer_does():
    """Issue 48: the output of a run whose calls constraints refused names them (the same on
    a resumed run: a function of the log); an answer that says so already is kept."""
    refused = replay.Entry(
        3,
        run_pb2.STEP_KIND_TOOL_RESULT,
        2,
        {"tool": "send_email", "status": "error", "refused_by": "value_allowed"},
    )
    ok = replay.Entry(5, run_pb2.STEP_KIND_TOOL_RESULT, 4, {"tool": "chat_post", "status": "ok"})
    finish, output = steps.completion(7, "done", [refused, ok])
    assert output == (
        "done\n\n[agentrun] 1 tool call(s) were refused by constraints and did not run: "
        "send_email (step 3, value_allowed)."
    )
    payload = json.loads(finish.payload_json)
    assert payload["output"] == output
    assert payload["refused_calls"] == [{"seq": 3, "tool": "send_email", "rule": "value_allowed"}]
    assert steps.completion(7, "The mail was refused.", [refused])[1] == "The mail was refused."
    assert steps.completion(7, "done", [ok])[1] == "done"
