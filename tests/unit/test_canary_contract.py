"""The canary's executor model and verdict, as pure logic (the real path: test_canary.py)."""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import UTC, datetime
from typing import Any

from control_plane.deploys import canary as cp_canary
from control_plane.deploys import canary_stages as stages
from control_plane.store.runs import Run
from control_plane.store.steps import Step
from executor import canary

NONCE = "0123456789abcdef0123456789abcdef"
CANARY_WS = "agentrun-internal-canary"
RUN_ID = uuid.uuid4()


async def test_the_model_asks_for_the_noop_then_answers_the_marker_with_the_echoed_nonce():
    model = canary.CanaryModel()
    user = [{"role": "user", "content": f"contract canary canary-nonce:{NONCE}"}]
    first = await model.complete("m", user, [], "run", 1)
    (call,) = first.tool_calls
    assert call.name == canary.TOOL and call.arguments == {"nonce": NONCE}
    echoed = str(canary.tool_output(call.arguments))
    done = await model.complete("m", [*user, {"role": "tool", "content": echoed}], [], "run", 3)
    assert done.content == f"{canary.MARKER} {NONCE}" and not done.tool_calls


async def test_without_the_tool_result_there_is_no_marker():
    reply = await canary.CanaryModel().complete(
        "m", [{"role": "user", "content": f"x canary-nonce:{NONCE}"}], [], "run", 1
    )
    assert reply.content is None


def test_the_two_sides_agree_on_the_contract():
    assert canary.WORKSPACE == cp_canary.CANARY_WORKSPACE
    assert canary.MARKER == cp_canary.MARKER and canary.TOOL == cp_canary.CANARY_TOOL


def _run(**changes: object) -> Run:
    now = datetime.now(UTC)
    base = Run(
        workspace_id=cp_canary.CANARY_WORKSPACE,
        run_id=RUN_ID,
        agent_id="canary",
        agent_version=1,
        status="completed",
        wait_reason=None,
        wake_at=None,
        lease_owner=None,
        lease_epoch=1,
        attempt=0,
        request_id=None,
        input="",
        output=None,
        error=None,
        max_steps=12,
        max_tokens=1,
        max_tool_calls=2,
        deadline_seconds=60,
        model_retry_budget=1,
        max_age_seconds=0,
        expires_at=None,
        repeat_limit=3,
        context_tokens=0,
        step_count=6,
        model_calls=2,
        tool_calls=1,
        tokens_used=0,
        active_seconds=0.1,
        held_since=None,
        started_by=None,
        waiting_connection_id=None,
        parent_run_id=None,
        parent_seq=None,
        created_at=now,
        updated_at=now,
        started_at=now,
        finished_at=now,
        held_seconds=0.0,
        release="B",
        forked_from_run_id=None,
        forked_from_seq=None,
        input_tokens=0,
        output_tokens=0,
        cached_tokens=0,
        reasoning_tokens=0,
        cost_micros=0,
        credits_reserved_micros=0,
        credit_chunks=0,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def _step(seq: int, kind: str, payload: dict[str, Any]) -> Step:
    return Step(CANARY_WS, RUN_ID, seq, kind, 1, None, json.dumps(payload), datetime.now(UTC))


ECHO = {"echo": f"canary-nonce:{NONCE}"}
FULL_LOG = [
    _step(1, "input", {}),
    _step(2, "model_decision", {}),
    _step(3, "tool_started", {"tool": cp_canary.CANARY_TOOL}),
    _step(4, "tool_result", {"tool": cp_canary.CANARY_TOOL, "status": "ok", "output": ECHO}),
    _step(5, "model_decision", {}),
    _step(6, "finish", {"status": "completed"}),
]


def test_only_a_completion_with_the_exact_marker_passes():
    assert stages.run_failure(_run(output=stages.marker(NONCE)), FULL_LOG, NONCE, "B", 0.4) is None
    for run in (
        _run(output=f"{cp_canary.MARKER} {'f' * 32}"),  # another canary's marker
        _run(output=f"{cp_canary.MARKER} {NONCE} "),
    ):
        failed = stages.run_failure(run, FULL_LOG, NONCE, "B", 10.0)
        assert failed is not None and failed.stage == stages.COMPLETED, failed


def test_each_failure_names_the_first_stage_not_reached_and_why():
    not_done = {"status": "running", "finished_at": None, "output": None}
    cases = [
        # Nobody took it: the claim on B is the stage.
        (
            _run(**{**not_done, "status": "queued", "lease_epoch": 0}),
            [],
            "B",
            "claimed on release B",
            "no executor took it within 10s",
        ),
        # Taken by another release's executor (only possible unpinned: the newest).
        (
            _run(release="A", **not_done),
            FULL_LOG[:1],
            "B",
            "claimed on release B",
            "claimed on release A",
        ),
        (
            _run(release="A", **not_done),
            FULL_LOG[:2],
            None,
            stages.TOOL_STARTED,
            "canary_noop never started",
        ),
        # Parked by a crash after the tool started: named, with the park's note.
        (
            _run(status="waiting", wait_reason="executor_error", finished_at=None, output=None),
            [*FULL_LOG[:3], _step(4, "park", {"wait_reason": "executor_error", "note": "boom"})],
            "B",
            stages.TOOL_RESULT,
            "started (step 3), no result; the run parked (executor_error): boom",
        ),
        (
            _run(status="failed", output=None, error="internal error"),
            [*FULL_LOG[:3], _step(4, "tool_result", {"tool": cp_canary.CANARY_TOOL, "output": {}})],
            "B",
            stages.TOOL_RESULT,
            "does not echo the nonce",
        ),
        (_run(**not_done), FULL_LOG[:5], "B", stages.COMPLETED, "after 10s the run is running"),
    ]
    for run, log, release, stage, why in cases:
        failed = stages.run_failure(run, log, NONCE, release, 10.0)
        assert failed is not None and failed.stage == stage and why in failed.reason, failed
        assert str(failed).startswith(f"{stage}: ")
    inner = stages.Failed(stages.TOOL_RESULT, "no result")
    assert str(inner.inside(stages.SESSION_TURN)) == "session turn: tool result: no result"


def test_a_parked_canary_has_its_answer_and_an_unclaimed_queued_one_not_yet():
    assert stages.settled(_run(status="waiting", finished_at=None, output=None))
    assert not stages.settled(_run(status="waiting", lease_epoch=0, finished_at=None))
    assert not stages.settled(_run(status="running", finished_at=None))
