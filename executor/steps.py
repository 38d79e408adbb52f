"""Builds the steps and transitions the executor commits (payload shapes: docs/protocol.md)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from google.protobuf import duration_pb2

from agentrun.v1 import executor_pb2, run_pb2
from executor import context, storable
from executor.models.base import (
    COMPLETE,
    FILTERED,
    REFUSED,
    TRUNCATED,
    ModelReply,
    ModelSettings,
    ToolCall,
)
from executor.replay import (
    DECISION,
    FINISH,
    PARK,
    RESULT,
    STARTED,
    SUMMARY,
    Entry,
    HoldRepeat,
    call_signature,
)
from executor.tools import keys

# The wait of a run whose repeated call is held for a person.
REPEAT_WAIT = "repeat"
# The step log's shape this executor writes (Hello.log_version), and the oldest it reads
# (Hello.log_reads_from): raise LOG_VERSION when a step's payload changes in a way an older
# executor cannot read, and LOG_READS_FROM when this one stops reading an old shape.
LOG_VERSION = 1
LOG_READS_FROM = 1


def new_step(
    seq: int, kind: int, payload: Mapping[str, Any], ref_seq: int = 0
) -> executor_pb2.NewStep:
    return executor_pb2.NewStep(
        seq=seq,
        kind=kind,  # type: ignore[arg-type]
        ref_seq=ref_seq,
        payload_json=storable.json_text(payload),
    )


def as_entry(step: executor_pb2.NewStep) -> Entry:
    """The committed step as the replay logic reads it."""
    return Entry(step.seq, step.kind, step.ref_seq, json.loads(step.payload_json))


def unique_call_ids(calls: tuple[ToolCall, ...], seq: int) -> tuple[ToolCall, ...]:
    """Give every call a distinct id: results are matched to calls by id."""
    seen: set[str] = set()
    fixed = []
    for index, call in enumerate(calls):
        call_id = call.id
        if not call_id or call_id in seen:
            call_id = f"call_{seq}_{index}"
        seen.add(call_id)
        fixed.append(ToolCall(call_id, call.name, call.arguments, call.arguments_raw))
    return tuple(fixed)


def decision(seq: int, reply: ModelReply, model: str) -> executor_pb2.NewStep:
    """The model's reply as a `model_decision` step.

    A reply that is no answer (cut off, filtered, refused: `reply.ending`) keeps
    its text and usage but none of its tool calls: a truncated call's arguments
    cannot be trusted, and the run fails right after (`failed_reply`).
    """
    complete = reply.ending == COMPLETE
    payload: dict[str, Any] = {
        "content": reply.content,
        "tool_calls": [call.to_payload() for call in reply.tool_calls] if complete else [],
        "usage": reply.usage.to_payload(),
        "model": reply.model or model,
        "response_id": reply.response_id,
    }
    if reply.stop_reason:
        payload["stop_reason"] = reply.stop_reason
    if not complete:
        payload["ending"] = reply.ending
        payload["dropped_tool_calls"] = len(reply.tool_calls)
    if reply.refusal is not None:
        payload["refusal"] = reply.refusal
    if reply.duration_ms is not None:
        payload["duration_ms"] = reply.duration_ms
    return new_step(seq, DECISION, payload)


def summary(seq: int, span: context.Span, reply: ModelReply, model: str) -> executor_pb2.NewStep:
    """The model's recap of the span, recorded once: later prompts read it in its place."""
    return new_step(seq, SUMMARY, context.payload(span, reply, model))


def failed_reply(reply: ModelReply, settings: ModelSettings) -> str | None:
    """The run's error when the reply is no answer to act on, else None.

    Such a run fails rather than retries: the same request would be cut off,
    filtered or refused again. The fix is a new agent version (a larger
    `model_parameters.max_tokens`, other instructions) or another model.
    """
    said = f" (stop reason {reply.stop_reason})" if reply.stop_reason else ""
    if reply.ending == TRUNCATED:
        limit = f"max_tokens {settings.max_tokens}" if settings.max_tokens else "its token limit"
        return f"model reply cut off at {limit}{said}: not a complete answer"
    if reply.ending == FILTERED:
        return f"model reply stopped by the provider's content filter{said}"
    if reply.ending == REFUSED:
        why = (reply.refusal or "").strip()[:500]
        return "the model refused" + (f": {why}" if why else f"{said}")
    return None


def tool_started(
    seq: int,
    decision_seq: int,
    call_id: str,
    tool: str,
    arguments: Mapping[str, Any],
    run_id: str,
    call_class: str,
) -> executor_pb2.NewStep:
    payload = {
        "call_id": call_id,
        "tool": tool,
        "arguments": dict(arguments),
        "idempotency_key": keys.derive(run_id, seq),
        "class": call_class,
    }
    return new_step(seq, STARTED, payload, ref_seq=decision_seq)


def tool_result(
    seq: int,
    ref_seq: int,
    call_id: str,
    tool: str,
    status: str,
    *,
    output: Any = None,
    error: str | None = None,
    resolution: str | None = None,
    untrusted: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> executor_pb2.NewStep:
    """A tool's result; an `unknown` one waits for a person (`"awaiting": "human"`).

    `untrusted`: the origin of outside text in the output (the model reads it
    delimited as data); `extra`: more fields (e.g. the constraint that refused it).
    """
    payload: dict[str, Any] = {"call_id": call_id, "tool": tool, "status": status, "output": output}
    if error is not None:
        payload["error"] = error
    if resolution is not None:
        payload["resolution"] = resolution
    if status == "unknown":
        payload["awaiting"] = "human"
    if untrusted is not None and status == "ok":
        payload["untrusted"] = untrusted
    payload.update(extra or {})
    return new_step(seq, RESULT, payload, ref_seq=ref_seq)


def repeat_hold(seq: int, action: HoldRepeat) -> list[executor_pb2.NewStep]:
    """A repeated call held for a person: its `repeated` result and the park, at seq, seq+1."""
    call = action.call
    shown = _arguments_shown(call)
    why = (
        f"{call.name}({shown}) was called {action.count} times with the same arguments "
        f"(limit {action.limit}; earlier in the decisions at steps "
        f"{', '.join(map(str, action.earlier))}); it was not run"
    )
    _, digest = call_signature(call)
    detail = {
        "count": action.count,
        "limit": action.limit,
        "earlier": list(action.earlier),
        "arguments_sha256": digest,
    }
    result = tool_result(
        seq,
        action.decision_seq,
        call.id,
        call.name,
        "repeated",
        error=why,
        extra={"awaiting": "human", "held": "repeat", "repeat": detail},
    )
    note = (
        f"repeated call held: {why}. A person decides on step {seq} "
        "(ResolveUnknownOutcome: RETRY lets it run, NOT_HAPPENED refuses it, FAIL_RUN stops "
        "the run) or cancels the run"
    )
    return [result, park(seq + 1, REPEAT_WAIT, None, note)]


def _arguments_shown(call: ToolCall, limit: int = 500) -> str:
    text = (
        json.dumps(call.arguments, ensure_ascii=False, sort_keys=True)
        if call.arguments is not None
        else repr(call.arguments_raw or "")
    )
    return text if len(text) <= limit else text[:limit] + "…"


def park(
    seq: int,
    wait_reason: str,
    wake_after: float | None,
    note: str,
    extra: Mapping[str, Any] | None = None,
) -> executor_pb2.NewStep:
    """A park step; `wake_after` None for a wait that an event ends (a person's decision);
    `extra`: more fields of its payload."""
    payload: dict[str, Any] = {"wait_reason": wait_reason, "note": note, **(extra or {})}
    if wake_after is not None:
        payload["wake_after_seconds"] = wake_after
    return new_step(seq, PARK, payload)


def unsent_mark(call_seq: int, epoch: int) -> dict[str, int]:
    """A park's fields saying the call started at `call_seq` never left under lease `epoch`
    (a rate limit, a connection that could not be used, our own side holding it back)."""
    return {"unsent_call_seq": call_seq, "epoch": epoch}


def known_unsent(entries: list[Entry], started_seq: int, epoch: int) -> bool:
    """True when the call started at `started_seq` is known never to have reached its
    provider: the log ends in a park marking it so, under the lease just before `epoch`.
    On resume it is then sent under its key whatever its class; once another executor held
    the run since, it could have been sent, and it is resolved by its class as usual."""
    if not entries or entries[-1].kind != PARK:
        return False
    payload = entries[-1].payload
    return payload.get("unsent_call_seq") == started_seq and payload.get("epoch") == epoch - 1


def park_transition(wait_reason: str, wake_after: float | None) -> executor_pb2.Park:
    """Park until `wake_after` seconds from now (database clock), or until an event."""
    if wake_after is None:
        return executor_pb2.Park(wait_reason=wait_reason)
    delay = duration_pb2.Duration()
    delay.FromNanoseconds(int(wake_after * 1_000_000_000))
    return executor_pb2.Park(wait_reason=wait_reason, wake_after=delay)


def finish_completed(
    seq: int, output: str, refused: list[dict[str, Any]] | None = None
) -> executor_pb2.NewStep:
    """`refused`: the calls constraints refused on the way (issue 48): a run that
    completed regardless says so in its finish step, never silently."""
    payload: dict[str, Any] = {"status": "completed", "output": output}
    if refused:
        payload["refused_calls"] = refused
    return new_step(seq, FINISH, payload)


def completion(seq: int, answer: str, entries: Iterable[Any]) -> tuple[executor_pb2.NewStep, str]:
    """The finish step of a run whose model gave its final `answer`, and the run's output:
    the answer, and when constraints refused calls on the way and the answer does not say
    so, a last paragraph that does (issue 48: a refusal is never a silent `completed`).
    A function of the log, so a resumed run writes the same."""
    refused = refused_calls(entries)
    output = answer
    if refused and "refused" not in answer.lower():
        calls = ", ".join(f"{r['tool']} (step {r['seq']}, {r['rule']})" for r in refused)
        note = f"[agentrun] {len(refused)} tool call(s) were refused by constraints and did not run: {calls}."
        output = f"{answer}\n\n{note}" if answer else note
    return finish_completed(seq, output, refused), output


def refused_calls(entries: Iterable[Any]) -> list[dict[str, Any]]:
    """The calls an argument constraint refused in the run's log: seq, tool and rule."""
    return [
        {"seq": e.seq, "tool": e.payload.get("tool"), "rule": e.payload["refused_by"]}
        for e in entries
        if e.kind == run_pb2.STEP_KIND_TOOL_RESULT and e.payload.get("refused_by")
    ]


def finish_failed(seq: int, error: str) -> executor_pb2.NewStep:
    return new_step(seq, FINISH, {"status": "failed", "error": error})
