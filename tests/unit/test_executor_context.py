"""The prompt the model reads: a stable prefix, and recaps in place of old steps.

Runs are built from the executor's own step builders (executor/steps.py), the
same payloads a run commits, and read back the way replay reads them.
"""

from __future__ import annotations

import json

from agentrun.v1 import run_pb2
from agentrun_cli.render import step_line
from executor import context, replay, steps, transcript
from executor.models.base import ModelReply, ToolCall, Usage
from executor.replay import Entry
from sandbox import summaries

INSTRUCTIONS = "You reconcile ledgers."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "echo",
            "description": "Echo a text back.",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
        },
    }
]
PAD = "x" * 200


def _add(entries: list[Entry], *new: object) -> None:
    entries.extend(steps.as_entry(step) for step in new)  # type: ignore[arg-type]


def run_with(turns: int) -> list[Entry]:
    """An input, then `turns` decisions that each call echo once and got its result."""
    entries = [steps.as_entry(steps.new_step(0, replay.INPUT, {"text": "check the ledger"}))]
    for _ in range(turns):
        add_turn(entries)
    return entries


def add_turn(entries: list[Entry], text: str = PAD) -> None:
    seq = replay.next_seq(entries)
    call = ToolCall(f"call_{seq}", "echo", {"text": f"{seq} {text}", "b": 1})
    reply = ModelReply(f"turn {seq}", (call,), Usage(100, 10), f"resp-{seq}", "m")
    _add(
        entries,
        steps.decision(seq, reply, "m"),
        steps.tool_started(seq + 1, seq, call.id, "echo", call.arguments or {}, "r", "read"),
        steps.tool_result(seq + 2, seq + 1, call.id, "echo", "ok", output={"z": 1, "echo": text}),
    )


def prompt(entries: list[Entry]) -> str:
    """The prompt as the sandbox records it: system message, tools, then the rest."""
    messages = transcript.build_messages(entries, INSTRUCTIONS)
    return summaries.prompt_text(messages, context.stable_tools(TOOLS))


def summarise(entries: list[Entry], span: context.Span, text: str = "recap") -> None:
    seq = replay.next_seq(entries)
    reply = ModelReply(text, (), Usage(700, 40), f"sum-{seq}", "m")
    _add(entries, steps.summary(seq, span, reply, "m"))


def assert_chat_valid(messages: list[dict]) -> None:
    """Every assistant tool call is answered by one tool message, right after it."""
    for i, message in enumerate(messages):
        if message["role"] == "tool":
            assert messages[i - 1]["role"] in ("assistant", "tool")
        calls = [c["id"] for c in message.get("tool_calls") or []]
        answers = [m["tool_call_id"] for m in messages[i + 1 : i + 1 + len(calls)]]
        assert answers == calls, (i, calls, answers)


# -- a stable prefix ----------------------------------------------------------


def test_each_prompt_extends_the_previous_one_byte_for_byte():
    entries = run_with(1)
    before = prompt(entries)
    for _ in range(5):
        add_turn(entries)
        after = prompt(entries)
        assert after.startswith(before) and len(after) > len(before)
        before = after


def test_a_step_read_back_from_the_database_renders_the_same_bytes():
    # jsonb returns object keys in its own order: arguments and outputs are sorted.
    live = run_with(3)
    reloaded = [
        Entry(e.seq, e.kind, e.ref_seq, _reorder(json.loads(json.dumps(e.payload)))) for e in live
    ]
    assert prompt(reloaded) == prompt(live)


def _reorder(value: object) -> object:
    """The same JSON value with every object's keys in reverse order."""
    if isinstance(value, dict):
        return {k: _reorder(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reorder(v) for v in value]
    return value


def test_tool_schemas_are_serialised_with_sorted_keys():
    shuffled = [_reorder(tool) for tool in TOOLS]
    assert json.dumps(context.stable_tools(shuffled)) == json.dumps(context.stable_tools(TOOLS))
    assert context.stable_tools(TOOLS) == TOOLS  # the same schema, only its key order fixed


def test_the_estimate_is_characters_of_compact_json_over_four():
    messages = [{"role": "user", "content": "abcd"}]
    text = json.dumps(TOOLS, separators=(",", ":"), sort_keys=True) + json.dumps(
        messages, separators=(",", ":"), sort_keys=True
    )
    assert context.estimate_tokens(messages, TOOLS) == -(-len(text) // 4)


# -- when to summarise, and what ------------------------------------------------


def _threshold_between(entries: list[Entry], turns_short: int) -> int:
    """A threshold the run exceeds now but did not `turns_short` turns ago."""
    size = context.estimate_tokens(transcript.build_messages(entries, INSTRUCTIONS), TOOLS)
    return size - turns_short * 100


def test_no_summary_without_a_threshold_or_under_it():
    entries = run_with(10)
    assert context.plan(entries, INSTRUCTIONS, TOOLS, 0) is None
    size = context.estimate_tokens(transcript.build_messages(entries, INSTRUCTIONS), TOOLS)
    assert context.plan(entries, INSTRUCTIONS, TOOLS, size) is None
    assert context.plan(entries, INSTRUCTIONS, TOOLS, size - 1) is not None


def test_past_the_threshold_the_older_turns_are_recapped_and_the_newest_kept():
    entries = run_with(10)  # decisions at seqs 1, 4, ..., 28
    threshold = _threshold_between(entries, 1)
    span = context.plan(entries, INSTRUCTIONS, TOOLS, threshold)
    assert span is not None
    assert span.from_seq == 1  # the input stays verbatim
    decisions = [e.seq for e in entries if e.kind == replay.DECISION]
    kept = [d for d in decisions if d > span.through_seq]
    assert span.through_seq + 1 in decisions  # whole turns: the span ends before a decision
    assert 1 <= len(kept) < len(decisions) and span.turns == len(decisions) - len(kept)
    kept_size = sum(
        context.estimate_tokens(transcript.turn_messages(t))
        for t in replay.decision_turns(entries)
        if t.decision.seq in kept
    )
    assert kept_size <= threshold // 2 or len(kept) == 1


def test_the_recap_stands_in_for_its_span_and_the_chat_stays_valid():
    entries = run_with(10)
    threshold = _threshold_between(entries, 1)
    span = context.plan(entries, INSTRUCTIONS, TOOLS, threshold)
    assert span is not None
    summarise(entries, span, "RECAP-TEXT")
    messages = transcript.build_messages(entries, INSTRUCTIONS)
    assert messages[0] == {"role": "system", "content": INSTRUCTIONS}
    assert messages[1] == {"role": "user", "content": "check the ledger"}
    assert messages[2]["role"] == "user" and messages[2]["content"].endswith("\nRECAP-TEXT")
    assert f"steps {span.from_seq}-{span.through_seq}" in messages[2]["content"]
    shown = {m.get("tool_call_id") for m in messages} - {None}
    assert shown == {f"call_{d}" for d in range(span.through_seq + 1, 30, 3)}
    assert_chat_valid(messages)
    # Smaller than the threshold now, and nothing more to recap: no second ask.
    assert context.estimate_tokens(messages, TOOLS) <= threshold
    assert context.plan(entries, INSTRUCTIONS, TOOLS, threshold) is None


def test_a_later_summary_recaps_the_earlier_recap_with_the_turns_after_it():
    entries = run_with(10)
    threshold = _threshold_between(entries, 1)
    first = context.plan(entries, INSTRUCTIONS, TOOLS, threshold)
    assert first is not None
    summarise(entries, first, "FIRST")
    while (second := context.plan(entries, INSTRUCTIONS, TOOLS, threshold)) is None:
        add_turn(entries)
    assert second.from_seq == first.from_seq and second.through_seq > first.through_seq
    request = context.request_messages(entries, INSTRUCTIONS, second)
    assert any(m["content"] and m["content"].endswith("\nFIRST") for m in request)
    summarise(entries, second, "SECOND")
    text = json.dumps(transcript.build_messages(entries, INSTRUCTIONS))
    assert "SECOND" in text and "FIRST" not in text
    assert second.turns == first.turns + sum(
        1
        for e in entries
        if e.kind == replay.DECISION and first.through_seq < e.seq <= second.through_seq
    )


def test_between_summaries_the_prompt_extends_again():
    entries = run_with(10)
    threshold = _threshold_between(entries, 1)
    span = context.plan(entries, INSTRUCTIONS, TOOLS, threshold)
    assert span is not None
    head = prompt(entries[:1])  # instructions, tools and the input: never replaced
    summarise(entries, span)
    before = prompt(entries)
    assert before.startswith(head)
    add_turn(entries)
    assert prompt(entries).startswith(before)


def test_the_summary_request_is_a_prefix_of_the_prompt_then_the_ask():
    entries = run_with(10)
    span = context.plan(entries, INSTRUCTIONS, TOOLS, _threshold_between(entries, 1))
    assert span is not None
    request = context.request_messages(entries, INSTRUCTIONS, span)
    current = transcript.build_messages(entries, INSTRUCTIONS)
    assert request[:-1] == current[: len(request) - 1]
    assert request[-1]["role"] == "user"
    assert request[-1]["content"].startswith(context.REQUEST_MARKER)
    assert summaries.is_request(request) and not summaries.is_request(current)
    assert summaries.REQUEST_MARKER == context.REQUEST_MARKER
    assert_chat_valid(request)
    assert sum(1 for m in request if m["role"] == "assistant") == span.turns


def test_a_summary_counts_its_tokens_but_is_not_a_model_call():
    entries = run_with(4)
    span = context.plan(entries, INSTRUCTIONS, TOOLS, _threshold_between(entries, 1))
    assert span is not None
    before = replay.counters(entries)
    summarise(entries, span)
    after = replay.counters(entries)
    assert after.model_calls == before.model_calls == 4
    assert after.tokens == before.tokens + 740
    # It asks nothing of the run: the next action is still the model call.
    assert replay.next_action(entries) == replay.CallModel()


def test_the_summary_payload_records_the_recap_its_span_and_usage():
    entries = run_with(4)
    span = context.plan(entries, INSTRUCTIONS, TOOLS, _threshold_between(entries, 1))
    assert span is not None
    reply = ModelReply("  the recap  ", (), Usage(700, 40), "sum-1", "")
    step = steps.summary(13, span, reply, "agent-model")
    assert step.kind == replay.SUMMARY
    assert json.loads(step.payload_json) == {
        "text": "the recap",
        "from_seq": span.from_seq,
        "through_seq": span.through_seq,
        "turns": span.turns,
        "prompt_tokens_estimated": span.prompt_tokens,
        "usage": {
            "prompt_tokens": 700,
            "completion_tokens": 40,
            "cached_tokens": 0,
            "reasoning_tokens": 0,
            "cache_write_tokens": 0,
        },
        "model": "agent-model",
        "response_id": "sum-1",
    }


def test_the_cli_shows_a_summary_step_as_its_span_and_recap():
    entries = run_with(4)
    span = context.plan(entries, INSTRUCTIONS, TOOLS, _threshold_between(entries, 1))
    assert span is not None
    new = steps.summary(13, span, ModelReply("the recap", (), Usage(700, 40), "s", "m"), "m")
    step = run_pb2.Step(seq=new.seq, kind=new.kind, payload_json=new.payload_json)
    line = step_line(step)
    assert line.startswith(f"13 summary recap of steps 1-{span.through_seq}: ")
    assert "the recap" in line and "[700+40 tokens]" in line
