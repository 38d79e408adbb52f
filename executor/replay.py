"""Resume a run from its step log: the next thing to do, from the log alone.

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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentrun.v1 import run_pb2
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
class Turn:
    """One model decision with the tool steps that answer it, per call id in seq order
    (executor/transcript.py renders it for the model)."""

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


def decision_turns(entries: list[Entry]) -> list[Turn]:
    """The model decisions in seq order, each with the tool steps that answer its calls."""
    return _turns(entries)


def _turns(entries: list[Entry]) -> list[Turn]:
    turns: list[Turn] = []
    for entry in entries:
        if entry.kind == DECISION:
            turns.append(Turn(entry, decision_calls(entry.payload)))
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


def repeats(turns: list[Turn], decision_seq: int, call: ToolCall) -> tuple[int, ...]:
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
