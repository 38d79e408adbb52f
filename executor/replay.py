"""Rebuild a run from its step log: the conversation so far and the next thing to do."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrun.v1 import run_pb2
from executor.models.base import ToolCall

INPUT = run_pb2.STEP_KIND_INPUT
DECISION = run_pb2.STEP_KIND_MODEL_DECISION
STARTED = run_pb2.STEP_KIND_TOOL_STARTED
RESULT = run_pb2.STEP_KIND_TOOL_RESULT
PARK = run_pb2.STEP_KIND_PARK
FINISH = run_pb2.STEP_KIND_FINISH


@dataclass(frozen=True)
class Entry:
    """One decoded step."""

    seq: int
    kind: int
    ref_seq: int
    payload: Mapping[str, Any]


@dataclass(frozen=True)
class CallModel:
    """Every call of the last decision is answered (or there is none yet): ask the model."""


@dataclass(frozen=True)
class StartTool:
    """A call of the last decision was never started: validate it, commit started, send."""

    decision_seq: int
    call: ToolCall


@dataclass(frozen=True)
class ResolveUnknown:
    """A call was started but has no result: resolve it by its class, never by guessing."""

    started: Entry

    @property
    def call_class(self) -> str:
        return str(self.started.payload.get("class", "none"))


@dataclass(frozen=True)
class FinishCompleted:
    """The last decision has no tool calls but the run was not finished: finish it."""

    output: str


@dataclass(frozen=True)
class Done:
    """The log already ends the run."""

    status: str


Action = CallModel | StartTool | ResolveUnknown | FinishCompleted | Done


@dataclass(frozen=True)
class Counters:
    """What the log says the run has consumed."""

    model_calls: int = 0
    tool_calls: int = 0
    tokens: int = 0


@dataclass
class _Turn:
    """One model decision with the tool steps that answer it."""

    decision: Entry
    calls: list[ToolCall]
    started: dict[str, Entry] = field(default_factory=dict)
    results: dict[str, Entry] = field(default_factory=dict)


def decode(steps: Iterable[run_pb2.Step]) -> list[Entry]:
    """Decode the steps' JSON payloads, in seq order."""
    entries = [
        Entry(s.seq, s.kind, s.ref_seq, json.loads(s.payload_json) if s.payload_json else {})
        for s in steps
    ]
    return sorted(entries, key=lambda e: e.seq)


def kind_name(kind: int) -> str:
    """`model_decision` for STEP_KIND_MODEL_DECISION, and so on."""
    return run_pb2.StepKind.Name(kind).removeprefix("STEP_KIND_").lower()  # type: ignore[arg-type]


def next_seq(entries: list[Entry]) -> int:
    return entries[-1].seq + 1 if entries else 0


def decision_calls(payload: Mapping[str, Any]) -> list[ToolCall]:
    """The tool calls recorded in a model_decision payload."""
    calls = []
    for raw in payload.get("tool_calls") or []:
        arguments = raw.get("arguments") if "arguments_raw" not in raw else None
        calls.append(
            ToolCall(
                str(raw.get("id", "")),
                str(raw.get("name", "")),
                arguments,
                raw.get("arguments_raw"),
            )
        )
    return calls


def _turns(entries: list[Entry]) -> list[_Turn]:
    turns: list[_Turn] = []
    for entry in entries:
        if entry.kind == DECISION:
            turns.append(_Turn(entry, decision_calls(entry.payload)))
        elif entry.kind in (STARTED, RESULT) and turns:
            slot = turns[-1].started if entry.kind == STARTED else turns[-1].results
            slot.setdefault(str(entry.payload.get("call_id", "")), entry)
    return turns


def next_action(entries: list[Entry]) -> Action:
    """What to do next, from the log alone (protocol.md, "Resume")."""
    for entry in entries:
        if entry.kind == FINISH:
            return Done(str(entry.payload.get("status", "")))
    turns = _turns(entries)
    if not turns:
        return CallModel()
    turn = turns[-1]
    for call in turn.calls:
        if call.id in turn.results:
            continue
        started = turn.started.get(call.id)
        if started is not None:
            return ResolveUnknown(started)
        return StartTool(turn.decision.seq, call)
    if not turn.calls:
        return FinishCompleted(str(turn.decision.payload.get("content") or ""))
    return CallModel()


def counters(entries: list[Entry]) -> Counters:
    """Model calls, tool calls and tokens the log records (the same the commits counted)."""
    model_calls = tool_calls = tokens = 0
    for entry in entries:
        if entry.kind == DECISION:
            model_calls += 1
            usage = entry.payload.get("usage") or {}
            tokens += int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0))
        elif entry.kind == STARTED:
            tool_calls += 1
    return Counters(model_calls, tool_calls, tokens)


def trailing_parks(entries: list[Entry], wait_reason: str) -> int:
    """How many park steps for this reason end the log in a row (drives backoff)."""
    count = 0
    for entry in reversed(entries):
        if entry.kind != PARK or entry.payload.get("wait_reason") != wait_reason:
            break
        count += 1
    return count


def build_messages(entries: list[Entry], instructions: str) -> list[dict[str, Any]]:
    """The OpenAI `messages` for the next model call, rebuilt from recorded outputs only."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    turns = {turn.decision.seq: turn for turn in _turns(entries)}
    for entry in entries:
        if entry.kind == INPUT:
            messages.append({"role": "user", "content": str(entry.payload.get("text", ""))})
        elif entry.kind == DECISION:
            messages.extend(_turn_messages(turns[entry.seq]))
    return messages


def _turn_messages(turn: _Turn) -> list[dict[str, Any]]:
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
    return json.dumps(call.arguments, ensure_ascii=False)


def _tool_content(turn: _Turn, call: ToolCall) -> str:
    result = turn.results.get(call.id)
    if result is None:
        return f"no result recorded: the call to {call.name} did not complete"
    return result_text(result.payload)


def result_text(payload: Mapping[str, Any]) -> str:
    """What the model sees for one tool_result payload."""
    status = payload.get("status")
    tool = payload.get("tool", "the tool")
    if status == "ok":
        return json.dumps(payload.get("output"), ensure_ascii=False)
    if status == "unknown":
        resolution = payload.get("resolution") or "it was not retried"
        return f"unknown outcome: the request may or may not have reached {tool}; {resolution}"
    return f"error: {payload.get('error') or 'the tool call failed'}"
