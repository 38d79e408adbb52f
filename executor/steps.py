"""Builds the steps and transitions the executor commits (payload shapes: docs/protocol.md)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from google.protobuf import duration_pb2

from agentrun.v1 import executor_pb2
from executor.models.base import ModelReply, ToolCall
from executor.replay import DECISION, FINISH, PARK, RESULT, STARTED, Entry
from executor.tools import keys


def new_step(
    seq: int, kind: int, payload: Mapping[str, Any], ref_seq: int = 0
) -> executor_pb2.NewStep:
    return executor_pb2.NewStep(
        seq=seq,
        kind=kind,  # type: ignore[arg-type]
        ref_seq=ref_seq,
        payload_json=json.dumps(payload, ensure_ascii=False, separators=(",", ":")),
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
    payload = {
        "content": reply.content,
        "tool_calls": [call.to_payload() for call in reply.tool_calls],
        "usage": {
            "prompt_tokens": reply.usage.prompt_tokens,
            "completion_tokens": reply.usage.completion_tokens,
        },
        "model": reply.model or model,
        "response_id": reply.response_id,
    }
    return new_step(seq, DECISION, payload)


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
) -> executor_pb2.NewStep:
    """A tool's result; an `unknown` one waits for a person (`"awaiting": "human"`)."""
    payload: dict[str, Any] = {"call_id": call_id, "tool": tool, "status": status, "output": output}
    if error is not None:
        payload["error"] = error
    if resolution is not None:
        payload["resolution"] = resolution
    if status == "unknown":
        payload["awaiting"] = "human"
    return new_step(seq, RESULT, payload, ref_seq=ref_seq)


def park(seq: int, wait_reason: str, wake_after: float | None, note: str) -> executor_pb2.NewStep:
    """A park step; `wake_after` None for a wait that an event ends (a person's decision)."""
    payload: dict[str, Any] = {"wait_reason": wait_reason, "note": note}
    if wake_after is not None:
        payload["wake_after_seconds"] = wake_after
    return new_step(seq, PARK, payload)


def park_transition(wait_reason: str, wake_after: float | None) -> executor_pb2.Park:
    """Park until `wake_after` seconds from now (database clock), or until an event."""
    if wake_after is None:
        return executor_pb2.Park(wait_reason=wait_reason)
    delay = duration_pb2.Duration()
    delay.FromNanoseconds(int(wake_after * 1_000_000_000))
    return executor_pb2.Park(wait_reason=wait_reason, wake_after=delay)


def finish_completed(seq: int, output: str) -> executor_pb2.NewStep:
    return new_step(seq, FINISH, {"status": "completed", "output": output})


def finish_failed(seq: int, error: str) -> executor_pb2.NewStep:
    return new_step(seq, FINISH, {"status": "failed", "error": error})
