"""The canary's executor model and verdict, as pure logic (the real path: test_canary.py)."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime

from control_plane.deploys import canary as cp_canary
from control_plane.store.runs import Run
from executor import canary

NONCE = "0123456789abcdef0123456789abcdef"


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
        run_id=uuid.uuid4(),
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


def test_only_a_completion_with_the_exact_marker_passes():
    passed, line = cp_canary.verdict(_run(output=f"{cp_canary.MARKER} {NONCE}"), NONCE, 0.4, 10)
    assert passed and line.startswith("PASS") and "release B" in line
    for run in (
        _run(output=f"{cp_canary.MARKER} {'f' * 32}"),  # another canary's marker
        _run(output=f"{cp_canary.MARKER} {NONCE} "),
        _run(status="failed", output=None, error="internal error"),
        _run(status="running", finished_at=None, output=None),  # claimed is not success
        _run(status="queued", lease_epoch=0, finished_at=None, output=None),
    ):
        passed, line = cp_canary.verdict(run, NONCE, 10.0, 10)
        assert not passed and line.startswith("FAIL"), line
