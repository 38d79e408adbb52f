"""The console's timeline: what each step shows and what an epoch change means."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

from control_plane.http.console import timeline
from control_plane.store.steps import Step

RUN = uuid.uuid4()
AT = datetime(2026, 12, 1, tzinfo=UTC)


def step(seq: int, kind: str, epoch: int, payload: dict, ref_seq: int | None = None) -> Step:
    return Step("ws", RUN, seq, kind, epoch, ref_seq, json.dumps(payload), AT)


def test_an_epoch_change_is_a_claim_a_wake_or_a_takeover() -> None:
    steps = [
        step(0, "input", 0, {"text": "hi"}),
        step(1, "model_decision", 1, {"tool_calls": [{"name": "lookup", "arguments": {}}]}),
        step(2, "tool_started", 2, {"tool": "lookup", "idempotency_key": "k", "class": "read"}),
        step(3, "park", 2, {"wait_reason": "rate", "wake_after_seconds": 1.5}),
        step(4, "tool_result", 3, {"tool": "lookup", "status": "ok", "output": 1}, ref_seq=2),
        step(5, "finish", 3, {"status": "completed", "output": "done"}),
    ]
    notes = [e.note for e in timeline.entries(steps)]
    assert notes == [
        "",
        "claimed by an executor (epoch 1)",
        "lease takeover: epoch 1 lapsed, now epoch 2",
        "",
        "woke and claimed again (epoch 3)",
        "",
    ]


def test_a_tool_call_shows_its_key_class_and_arguments_and_a_decision_its_tokens() -> None:
    decision, started = timeline.entries(
        [
            step(
                1,
                "model_decision",
                1,
                {
                    "tool_calls": [{"name": "send_email", "arguments": {"to": "ada@example.com"}}],
                    "usage": {"prompt_tokens": 80, "completion_tokens": 11},
                    "model": "m",
                },
            ),
            step(
                2,
                "tool_started",
                1,
                {
                    "tool": "send_email",
                    "arguments": {"to": "ada@example.com"},
                    "idempotency_key": f"{RUN}:2",
                    "class": "provider_key",
                },
                ref_seq=1,
            ),
        ]
    )
    assert decision.summary == "call send_email" and ("tokens", "91") in decision.fields
    assert ("key", f"{RUN}:2") in started.fields and ("class", "provider_key") in started.fields
    assert json.loads(started.code) == {"to": "ada@example.com"}


def test_an_unknown_outcome_asks_for_a_decision_until_one_refers_to_it() -> None:
    unknown = step(
        3,
        "tool_result",
        1,
        {"tool": "chat_post", "status": "unknown", "awaiting": "human"},
        ref_seq=2,
    )
    (pending,) = timeline.entries([unknown])
    assert pending.unknown and "waits for a person" in pending.note
    decided = step(
        5,
        "tool_result",
        2,
        {"tool": "chat_post", "status": "ok", "decision": "happened", "decided_by": "key:ops"},
        ref_seq=3,
    )
    first, second = timeline.entries([unknown, decided])
    assert not first.unknown and second.resolves == 3
    assert ("decided", "happened by key:ops") in second.fields


def test_an_edited_approval_is_a_diff_of_the_arguments() -> None:
    (e,) = timeline.entries(
        [
            step(
                3,
                "approval_decided",
                1,
                {
                    "tool": "send_email",
                    "decision": "edited",
                    "decided_by": "ann",
                    "via": "signed_in",
                    "arguments": {"body": "90", "to": "ada"},
                    "edited_from": {"body": "100", "to": "ada"},
                },
            ),
        ]
    )
    assert [(m, line.strip()) for m, line in e.diff if m != " "] == [
        ("-", '"body": "100",'),
        ("+", '"body": "90",'),
    ]
