"""The conversation a model call reads, rendered from the recorded steps alone."""

from __future__ import annotations

import json
import operator
from collections.abc import Mapping
from typing import Any

from executor import untrusted
from executor.approval import canonical_json
from executor.models.base import ToolCall
from executor.replay import APPROVAL_DECIDED, DECISION, INPUT, SUMMARY, Entry, Turn, decision_turns


class RenderedTurns:
    """One run's turns as build_messages last rendered them, kept between its model calls
    so that a turn is rendered again only when its steps changed (rendering every turn
    at every call made a run's prompts cost the square of its length).

    A turn's messages depend on its decision and its steps alone, and a held run's log
    only grows: entries are frozen and their payloads only read. So a turn whose decision
    and steps are the very same Entry objects as last time renders the very same
    messages; anything else (a step added to it, a log decoded again) renders afresh.
    One per run (the run loop's): the messages it returns are shared, read only."""

    def __init__(self) -> None:
        self._turns: dict[int, tuple[tuple[Entry, ...], list[dict[str, Any]]]] = {}
        # len(canonical_json(message)) of the kept turns' messages, by id (None: not yet
        # measured); a message leaves it when its turn is rendered again, so an id here
        # is always a message still kept (never one freed and its id reused).
        self._chars: dict[int, int | None] = {}

    def messages(self, turn: Turn) -> list[dict[str, Any]]:
        key = (turn.decision, *(e for history in turn.steps.values() for e in history))
        kept = self._turns.get(turn.decision.seq)
        if kept is not None and len(kept[0]) == len(key) and all(map(operator.is_, kept[0], key)):
            return kept[1]
        rendered = turn_messages(turn)
        if kept is not None:
            for message in kept[1]:
                self._chars.pop(id(message), None)
        self._chars.update((id(message), None) for message in rendered)
        self._turns[turn.decision.seq] = (key, rendered)
        return rendered

    def chars(self, message: Mapping[str, Any]) -> int:
        """len(canonical_json(message)): measured once for a kept turn's message."""
        if id(message) not in self._chars:  # not a kept one (the instructions, an input)
            return len(canonical_json(message))
        n = self._chars[id(message)]
        if n is None:
            n = self._chars[id(message)] = len(canonical_json(message))
        return n


def build_messages(
    entries: list[Entry], instructions: str, rendered: RenderedTurns | None = None
) -> list[dict[str, Any]]:
    """The OpenAI `messages` for the next model call, rebuilt from recorded outputs only.

    Most stable first (executor/context.py): the instructions, then the steps in seq
    order, each rendered from its recorded payload alone, so the next call's messages
    extend these byte for byte. The latest summary's recap stands in for the steps it
    covers (from_seq..through_seq). With `rendered` (the run's), turns unchanged since
    the last call are not rendered again."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    by_seq = {turn.decision.seq: turn for turn in decision_turns(entries)}
    recap = latest_summary(entries)
    start, through = (recap.payload["from_seq"], recap.payload["through_seq"]) if recap else (0, -1)
    for entry in entries:
        if recap is not None and entry.seq >= start:
            messages.append(recap_message(recap.payload))  # where the span began
            recap = None
        if start <= entry.seq <= through:
            continue
        if entry.kind == INPUT:
            # A session turn's input carries the earlier turns' transcript: it goes first.
            messages.extend(history_messages(entry.payload))
            messages.append({"role": "user", "content": input_text(entry.payload)})
        elif entry.kind == DECISION:
            turn = by_seq[entry.seq]
            messages.extend(rendered.messages(turn) if rendered else turn_messages(turn))
    return messages


def latest_summary(entries: list[Entry]) -> Entry | None:
    """The newest summary step: its recap replaces every earlier one."""
    return next((e for e in reversed(entries) if e.kind == SUMMARY), None)


def recap_message(payload: Mapping[str, Any]) -> dict[str, Any]:
    """A summary's recap as the model reads it, in place of the steps it covers."""
    head = (
        f"[Recap of steps {payload['from_seq']}-{payload['through_seq']} of this run, "
        "written by the model earlier to keep the prompt short; the steps after it follow "
        "verbatim.]"
    )
    return {"role": "user", "content": f"{head}\n{payload.get('text') or ''}"}


def input_text(payload: Mapping[str, Any]) -> str:
    """The input as the model reads it: outside text (a mail, a webhook) as marked data."""
    text = str(payload.get("text", ""))
    source = untrusted.input_source(payload)
    return untrusted.wrap(text, source) if source else text


def history_messages(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The `history` of an input payload as chat messages (user and assistant text only)."""
    out = []
    for item in payload.get("history") or []:
        if isinstance(item, Mapping) and item.get("role") in ("user", "assistant"):
            out.append({"role": item["role"], "content": str(item.get("content") or "")})
    return out


def turn_messages(turn: Turn) -> list[dict[str, Any]]:
    """One decision as an assistant message, then exactly one tool message per call."""
    assistant: dict[str, Any] = {
        "role": "assistant",
        "content": turn.decision.payload.get("content"),
    }
    if turn.calls:
        assistant["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": _arguments_text(call)},
            }
            for call in turn.calls
        ]
    # Exactly one tool message per call, in call order, before the next assistant message.
    tool_messages = [
        {"role": "tool", "tool_call_id": call.id, "content": _tool_content(turn, call)}
        for call in turn.calls
    ]
    return [assistant, *tool_messages]


def _arguments_text(call: ToolCall) -> str:
    if call.arguments is None:
        return call.arguments_raw or ""
    # Sorted keys: the same text whether the step was read back from the database or not.
    return json.dumps(call.arguments, ensure_ascii=False, sort_keys=True)


def _tool_content(turn: Turn, call: ToolCall) -> str:
    result = turn.result(call.id)
    if result is None:
        return f"no result recorded: the call to {call.name} did not complete"
    return _edit_note(turn.steps.get(call.id, [])) + result_text(result.payload)


def _edit_note(history: list[Entry]) -> str:
    """If a human edited the call before it ran, say so (and how) before its result."""
    decided = [e.payload for e in history if e.kind == APPROVAL_DECIDED]
    if not decided or decided[-1].get("decision") != "edited":
        return ""
    d = decided[-1]
    before = json.dumps(d.get("edited_from"), ensure_ascii=False, sort_keys=True)
    after = json.dumps(d.get("arguments"), ensure_ascii=False, sort_keys=True)
    note = f" ({d['note']})" if d.get("note") else ""
    return (
        f"note: {d.get('decided_by', 'a human')} edited the arguments before it ran{note}, "
        f"from {before} to {after}. result: "
    )


def result_text(payload: Mapping[str, Any]) -> str:
    """What the model sees for one tool_result payload."""
    status = payload.get("status")
    tool = payload.get("tool", "the tool")
    if payload.get("decision"):
        return _decision_text(payload)
    if status == "rejected":
        return str(payload.get("output") or "rejected")
    if status == "ok":
        output = payload.get("output")
        # A result stored as a payload records the very text the model reads (its view).
        stored = "payload" in payload and isinstance(output, str)
        text = str(output) if stored else json.dumps(output, ensure_ascii=False, sort_keys=True)
        origin = payload.get("untrusted")
        return untrusted.wrap(text, str(origin)) if origin else text
    if status == "repeated":
        return f"not run: {payload.get('error') or 'a repeated call waits for a person'}"
    if status == "unknown":
        resolution = payload.get("resolution") or "it was not retried"
        return f"unknown outcome: the request may or may not have reached {tool}; {resolution}"
    return f"error: {payload.get('error') or 'the tool call failed'}"


_DECISIONS = {
    "happened": "it happened",
    "not_happened": "it did not happen, and it was not sent again",
    "retry": "it did not happen; it is sent again",
    "fail_run": "the run is stopped",
}


_REPEAT_DECISIONS = {
    "retry": "let it run",
    "not_happened": "refused it: it was not run; do not repeat it",
    "fail_run": "stopped the run",
}


def _decision_text(payload: Mapping[str, Any]) -> str:
    """A person's decision on an unknown outcome (or a held repeat), as the model reads it."""
    who = payload.get("decided_by") or "a person"
    if payload.get("held") == "repeat":
        said = _REPEAT_DECISIONS.get(str(payload.get("decision")), str(payload.get("decision")))
        text = (
            f"the call to {payload.get('tool', 'the tool')} repeated earlier identical calls "
            f"and was held; {who} {said}"
        )
        return f"{text} (note: {payload['note']})" if payload.get("note") else text
    said = _DECISIONS.get(str(payload.get("decision")), str(payload.get("decision")))
    text = (
        f"the outcome of the call to {payload.get('tool', 'the tool')} was unknown; "
        f"{who} checked and decided: {said}"
    )
    note = payload.get("note")
    return f"{text} (note: {note})" if note else text
