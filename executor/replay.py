"""Rebuild a run from its step log: the conversation so far and the next thing to do.

Each tool call of the last model decision is settled by the latest of its
steps: none yet → start it; a `tool_started` alone → an unknown outcome to
resolve by class; a `tool_result` → answered, unless it is an unknown that
waits for a person (then the run waits) or a person's decision on one, which
says: it happened / it did not (answered), retry (start the call again, under
a new key), or fail the run. A person's decision is a `tool_result` written by
the control plane whose `ref_seq` is the unknown result it settles.

Repetition guard: a call that repeats an earlier one (same tool, same
arguments hash) for the run's `repeat_limit`-th time is never started. The
executor records it as a `tool_result` with status `repeated` and
`"awaiting": "human"` (`"held": "repeat"`) and parks the run (`repeat`); the
person's decision on it is read like one on an unknown outcome: retry = let
it run, not_happened = refused, fail_run. A go-ahead restarts the count.
"""

from __future__ import annotations

import hashlib
import json
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrun.v1 import run_pb2
from executor import untrusted
from executor.approval import Verdict, canonical_json, check
from executor.models.base import ToolCall

INPUT = run_pb2.STEP_KIND_INPUT
DECISION = run_pb2.STEP_KIND_MODEL_DECISION
STARTED = run_pb2.STEP_KIND_TOOL_STARTED
RESULT = run_pb2.STEP_KIND_TOOL_RESULT
PARK = run_pb2.STEP_KIND_PARK
FINISH = run_pb2.STEP_KIND_FINISH
APPROVAL_REQUESTED = run_pb2.STEP_KIND_APPROVAL_REQUESTED
APPROVAL_DECIDED = run_pb2.STEP_KIND_APPROVAL_DECIDED
SUMMARY = run_pb2.STEP_KIND_SUMMARY
CALL_STEPS = (STARTED, RESULT, APPROVAL_REQUESTED, APPROVAL_DECIDED)


@dataclass(frozen=True)
class Entry:
    """One decoded step; `created_at` is its database time (None: just committed here)."""

    seq: int
    kind: int
    ref_seq: int
    payload: Mapping[str, Any]
    created_at: float | None = None

    @property
    def awaits_person(self) -> bool:
        """An unknown tool result that waits for a person's decision."""
        return self.kind == RESULT and self.payload.get("awaiting") == "human"

    @property
    def decision(self) -> str | None:
        """For a person's decision on an unknown outcome: happened, not_happened, retry, fail_run."""
        value = self.payload.get("decision") if self.kind == RESULT else None
        return str(value) if value else None


@dataclass(frozen=True)
class CallModel:
    """Every call of the last decision is answered (or there is none yet): ask the model."""


@dataclass(frozen=True)
class StartTool:
    """A call of the last decision was never started: validate it, commit started, send.

    `approval` is the checked human decision when the call was held for one
    (its arguments are what will be sent); None when it was never held.
    """

    decision_seq: int
    call: ToolCall
    approval: Verdict | None = None


@dataclass(frozen=True)
class HoldRepeat:
    """The call repeats earlier identical calls (`earlier`: their decision seqs): not
    started; recorded as held and the run waits for a person."""

    decision_seq: int
    call: ToolCall
    earlier: tuple[int, ...]
    limit: int

    @property
    def count(self) -> int:
        return len(self.earlier) + 1


@dataclass(frozen=True)
class AwaitApproval:
    """A held call has no decision yet: the run keeps waiting (nothing new is asked)."""

    requested: Entry


@dataclass(frozen=True)
class RefuseCall:
    """A human rejected the call, or its approval does not match: answer it, send nothing."""

    decision_seq: int
    call: ToolCall
    text: str
    tampered: bool


@dataclass(frozen=True)
class ResolveUnknown:
    """A call was started but has no result: resolve it by its class, never by guessing."""

    started: Entry

    @property
    def call_class(self) -> str:
        return str(self.started.payload.get("class", "none"))


@dataclass(frozen=True)
class AwaitPerson:
    """An unknown outcome waits for a person's decision: the run must stay parked."""

    result: Entry


@dataclass(frozen=True)
class FailRun:
    """A person decided that an unknown outcome fails the run."""

    error: str


@dataclass(frozen=True)
class FinishCompleted:
    """The last decision has no tool calls but the run was not finished: finish it."""

    output: str


@dataclass(frozen=True)
class Done:
    """The log already ends the run."""

    status: str


Action = (
    CallModel
    | StartTool
    | HoldRepeat
    | ResolveUnknown
    | AwaitPerson
    | AwaitApproval
    | RefuseCall
    | FailRun
    | FinishCompleted
    | Done
)


@dataclass(frozen=True)
class Counters:
    """What the log says the run has consumed."""

    model_calls: int = 0
    tool_calls: int = 0
    tokens: int = 0


@dataclass
class _Turn:
    """One model decision with the tool steps that answer it, per call id in seq order."""

    decision: Entry
    calls: list[ToolCall]
    steps: dict[str, list[Entry]] = field(default_factory=dict)

    def latest(self, call_id: str) -> Entry | None:
        """The call's latest tool_started or tool_result, which says where it stands."""
        found = self.steps.get(call_id)
        return found[-1] if found else None

    def result(self, call_id: str) -> Entry | None:
        """The call's latest tool_result (what the model reads for it)."""
        found = [e for e in self.steps.get(call_id, []) if e.kind == RESULT]
        return found[-1] if found else None


def decode(steps: Iterable[run_pb2.Step]) -> list[Entry]:
    """Decode the steps' JSON payloads, in seq order."""
    entries = [
        Entry(
            s.seq,
            s.kind,
            s.ref_seq,
            json.loads(s.payload_json) if s.payload_json else {},
            s.create_time.ToNanoseconds() / 1e9 if s.HasField("create_time") else None,
        )
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


def decision_turns(entries: list[Entry]) -> list[_Turn]:
    """The model decisions in seq order, each with the tool steps that answer its calls."""
    return _turns(entries)


def _turns(entries: list[Entry]) -> list[_Turn]:
    turns: list[_Turn] = []
    for entry in entries:
        if entry.kind == DECISION:
            turns.append(_Turn(entry, decision_calls(entry.payload)))
        elif entry.kind in CALL_STEPS and turns:
            call_id = str(entry.payload.get("call_id", ""))
            turns[-1].steps.setdefault(call_id, []).append(entry)
    return turns


def next_action(entries: list[Entry], repeat_limit: int = 0) -> Action:
    """What to do next, from the log alone (protocol.md, "Resume").

    `repeat_limit` (the run's; 0 = no guard): a call never acted on that would
    be the limit-th identical one is held instead of started.
    """
    for entry in entries:
        if entry.kind == FINISH:
            return Done(str(entry.payload.get("status", "")))
    turns = _turns(entries)
    if not turns:
        return CallModel()
    turn = turns[-1]
    for call in turn.calls:
        history = turn.steps.get(call.id, [])
        action = _call_action(turn.decision.seq, call, history)
        if action is not None and not history and repeat_limit > 0:
            earlier = repeats(turns, turn.decision.seq, call)
            if len(earlier) + 1 >= repeat_limit:
                return HoldRepeat(turn.decision.seq, call, earlier, repeat_limit)
        if action is not None:
            return action
    if not turn.calls:
        return FinishCompleted(str(turn.decision.payload.get("content") or ""))
    return CallModel()


def call_signature(call: ToolCall) -> tuple[str, str]:
    """What makes two calls the same: the tool and the hash of its canonical arguments."""
    text = canonical_json(call.arguments) if call.arguments is not None else call.arguments_raw
    return call.name, hashlib.sha256((text or "").encode()).hexdigest()


def _allowed_repeat(history: list[Entry]) -> bool:
    """A person let this held repeat run (which restarts the count)."""
    held = any(e.kind == RESULT and e.payload.get("held") == "repeat" for e in history)
    return held and any(e.decision == "retry" for e in history)


def repeats(turns: list[_Turn], decision_seq: int, call: ToolCall) -> tuple[int, ...]:
    """Decision seqs of the calls before `call` identical to it, since a person's go-ahead."""
    wanted = call_signature(call)
    found: list[int] = []
    for turn in turns:
        for other in turn.calls:
            if turn.decision.seq == decision_seq and other.id == call.id:
                return tuple(found)
            if call_signature(other) != wanted:
                continue
            if _allowed_repeat(turn.steps.get(other.id, [])):
                found = []
            else:
                found.append(turn.decision.seq)
    return tuple(found)


def _approval(decision_seq: int, call: ToolCall, history: list[Entry]) -> Action:
    """A held call whose decision arrived: run what was approved, or refuse."""
    requested = next(e for e in history if e.kind == APPROVAL_REQUESTED)
    decided = [e for e in history if e.kind == APPROVAL_DECIDED]
    if not decided:
        return AwaitApproval(requested)
    verdict = check(requested.payload, decided[-1].payload)
    if verdict.arguments is None:
        return RefuseCall(decision_seq, call, verdict.refusal or "refused", verdict.tampered)
    approved = ToolCall(call.id, call.name, dict(verdict.arguments))
    return StartTool(decision_seq, approved, verdict)


def _call_action(decision_seq: int, call: ToolCall, history: list[Entry]) -> Action | None:
    """What one call of the last decision needs next; None when it is answered."""
    latest = history[-1] if history else None
    if latest is None:
        return StartTool(decision_seq, call)
    if latest.kind in (APPROVAL_REQUESTED, APPROVAL_DECIDED):
        return _approval(decision_seq, call, history)
    if latest.kind == STARTED:
        return ResolveUnknown(latest)
    if latest.awaits_person:
        return AwaitPerson(latest)
    if latest.decision == "retry":
        held = any(e.kind == APPROVAL_REQUESTED for e in history)
        return _approval(decision_seq, call, history) if held else StartTool(decision_seq, call)
    if latest.decision == "fail_run":
        who = latest.payload.get("decided_by") or "a person"
        note = latest.payload.get("note")
        reason = f"the outcome of {call.name} was unknown and {who} failed the run"
        return FailRun(f"{reason}: {note}" if note else reason)
    return None


def counters(entries: list[Entry]) -> Counters:
    """Model calls, tool calls and tokens the log records (the same the commits counted).

    A summary's tokens count; the summary is not a model call (those are decisions)."""
    model_calls = tool_calls = tokens = 0
    for entry in entries:
        if entry.kind in (DECISION, SUMMARY):
            model_calls += entry.kind == DECISION
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

    def messages(self, turn: _Turn) -> list[dict[str, Any]]:
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
    by_seq = {turn.decision.seq: turn for turn in _turns(entries)}
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


def turn_messages(turn: _Turn) -> list[dict[str, Any]]:
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


def _tool_content(turn: _Turn, call: ToolCall) -> str:
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
