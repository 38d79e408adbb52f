"""privacy.project_step: what of each step a reader or an approver is shown (docs/streams.md,
"What each role sees"), and that every other caller gets the step as stored."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

from control_plane.auth import privacy
from control_plane.auth.principal import Kind, Principal
from control_plane.store.steps import Step


def step(kind: str, payload: dict[str, Any]) -> Step:
    return Step("ws", uuid.uuid4(), 3, kind, 1, None, json.dumps(payload), datetime.now(UTC))


def projected(kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(privacy.project_step(step(kind, payload), False).payload)
    return out


def test_raw_provider_fields_and_bookkeeping_are_left_out_and_the_rest_kept() -> None:
    decision = {
        "content": None,
        "tool_calls": [
            {"id": "c1", "name": "echo", "arguments": {"text": "hi"}},
            {"id": "c2", "name": "echo", "arguments_raw": "{not json"},
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2},
        "model": "m",
        "response_id": "chatcmpl-1",
        "stop_reason": "tool_calls",
        "refusal": "I won't",
        "ending": "refused",
        "duration_ms": 40,
    }
    assert projected("model_decision", decision) == {
        "content": None,
        "tool_calls": [
            {"id": "c1", "name": "echo", "arguments": {"text": "hi"}},
            {"id": "c2", "name": "echo"},
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2},
        "model": "m",
        "ending": "refused",
        "duration_ms": 40,
    }
    started = {"call_id": "c1", "tool": "echo", "arguments": {}, "idempotency_key": "r:3"}
    assert projected("tool_started", started) == {"call_id": "c1", "tool": "echo", "arguments": {}}
    park = {"wait_reason": "rate", "note": "n", "cause": "429", "unsent_call_seq": 2, "epoch": 1}
    assert projected("park", park) == {"wait_reason": "rate", "note": "n", "cause": "429"}
    summary = {
        "text": "the recap",
        "from_seq": 1,
        "through_seq": 9,
        "turns": 4,
        "prompt_tokens_estimated": 900,
        "usage": {"prompt_tokens": 1},
        "model": "m",
        "response_id": "x",
    }
    assert projected("summary", summary) == {
        "from_seq": 1,
        "through_seq": 9,
        "turns": 4,
        "redacted": True,
    }
    result = {"call_id": "c1", "tool": "echo", "status": "ok", "output": "hi"}
    assert projected("tool_result", result) == result


def test_who_sees_every_step_whole() -> None:
    def key(role: str) -> Principal:
        return Principal(Kind.KEY, "k", "ws", role)

    assert not privacy.sees_internals_of(key("reader"))
    assert not privacy.sees_internals_of(key("approver"))
    assert not privacy.sees_internals_of(Principal(Kind.PERSON, "p", "ws", "reader"))
    assert privacy.sees_internals_of(key("operator"))
    assert privacy.sees_internals_of(key("admin"))
    assert privacy.sees_internals_of(Principal(Kind.PLATFORM, "root"))
    assert privacy.sees_internals_of(None)  # the platform's own work
    whole = step("model_decision", {"content": "x", "response_id": "r"})
    assert privacy.project_step(whole, True) is whole
