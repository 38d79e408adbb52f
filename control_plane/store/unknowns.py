"""A person's decision on an unknown tool outcome: one compare-and-set, one step.

A tool call whose outcome nothing may settle (class `none`, or a key its
provider has forgotten) is recorded by the executor as a `tool_result` with
status `unknown` and `"awaiting": "human"`, and the run parks with
wait_reason `human` and no wake time. The decision is appended as another
`tool_result` whose `ref_seq` is that unknown result, and the same transaction
sets the run's `wake_at = now()` so that an executor picks it up. Setting
`wake_at` off NULL is the compare-and-set: exactly one decision wins.

A call the repetition guard held (status `repeated`, `"held": "repeat"`, the
run parked with wait_reason `repeat`) is decided the same way: retry lets it
run, not_happened refuses it, fail_run stops the run; happened does not apply
(it was never sent).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from control_plane.store.errors import StoreError
from control_plane.store.queries import run
from control_plane.store.runs import Run, get_run
from control_plane.store.steps import Step

DECISIONS = ("happened", "not_happened", "retry", "fail_run")
_STATUS = {"happened": "ok", "not_happened": "error", "retry": "error", "fail_run": "error"}
_MEANING = {
    "happened": "a person confirmed it happened",
    "not_happened": "a person confirmed it did not happen; it is not sent again",
    "retry": "a person confirmed it did not happen; it is sent again under a new key",
    "fail_run": "a person stopped the run",
}


class UndecidableError(StoreError):
    """The decision could not be recorded; subclasses say why."""


class RunNotFound(UndecidableError):
    pass


class StepNotFound(UndecidableError):
    pass


class NotAnUnknown(UndecidableError):
    """The step is not an unknown outcome awaiting a person."""


class RunNotWaiting(UndecidableError):
    """The run does not wait for this decision (cancelled, finished, ...)."""


class NotForRepeat(UndecidableError):
    """`happened` on a held repeat, which was never sent."""


_REPEAT_MEANING = {
    "not_happened": "a person refused the repeated call; it is not run",
    "retry": "a person let the repeated call run",
    "fail_run": "a person stopped the run",
}


class AlreadyDecided(UndecidableError):
    """Another decision won; carries the winning step."""

    def __init__(self, winner: asyncpg.Record) -> None:
        payload = json.loads(winner["payload"])
        super().__init__(
            f"already decided by {payload.get('decided_by') or 'someone'}: "
            f"{payload.get('decision')} (step {winner['seq']})"
        )
        self.winner = winner


@dataclass(frozen=True)
class Decision:
    workspace_id: str
    run_id: uuid.UUID
    seq: int  # the unknown tool_result
    decision: str  # one of DECISIONS
    decided_by: str
    note: str = ""


def step_payload(unknown: dict[str, Any], d: Decision) -> dict[str, Any]:
    """The decision step's payload: a tool_result the model and the executor read."""
    repeat = unknown.get("held") == "repeat"
    meaning = f"{(_REPEAT_MEANING if repeat else _MEANING)[d.decision]} ({d.decided_by})"
    payload: dict[str, Any] = {
        "call_id": unknown.get("call_id"),
        "tool": unknown.get("tool"),
        "status": _STATUS[d.decision],
        "output": None,
        "resolution": meaning,
        "decision": d.decision,
        "decided_by": d.decided_by,
    }
    if repeat:
        payload["held"] = "repeat"
    if payload["status"] == "error":
        payload["error"] = meaning
    if d.note:
        payload["note"] = d.note
    return payload


def _awaits_person(step: asyncpg.Record | None) -> dict[str, Any] | None:
    """The unknown result's payload, if `step` is one that waits for a person."""
    if step is None or step["kind"] != "tool_result":
        return None
    payload = json.loads(step["payload"])
    if payload.get("status") not in ("unknown", "repeated") or payload.get("awaiting") != "human":
        return None
    return payload


class _NotDecided(Exception):
    """Rolls the attempt back; the reason is worked out afterwards."""


async def decide(
    pool: asyncpg.pool.Pool,
    d: Decision,
    also: Callable[[asyncpg.Connection], Awaitable[Any]] | None = None,
    now: datetime | None = None,
) -> tuple[Run, Step]:
    """Record the decision exactly once: (the run, the decision step), or raise why not.

    `also` runs in the decision's transaction once it is recorded (the audit row).
    """
    try:
        async with pool.acquire() as conn, conn.transaction():
            decided = await _decide(conn, d, now)
            if also is not None:
                await also(conn)
            return decided
    except _NotDecided:
        pass
    raise await _why_not(pool, d)


async def _decide(conn: asyncpg.Connection, d: Decision, now: datetime | None) -> tuple[Run, Step]:
    ws, run_id = d.workspace_id, d.run_id
    claimed = await run(conn, "unknown_claim_decision", ws, run_id, now)
    if claimed is None:
        raise _NotDecided
    run_row = Run.from_record(claimed)
    # The run row is locked now: what follows reads the latest committed state.
    unknown = _awaits_person(await run(conn, "unknown_step_get", ws, run_id, d.seq))
    if unknown is None or await run(conn, "unknown_decision_get", ws, run_id, d.seq):
        raise _NotDecided
    if unknown.get("held") == "repeat" and d.decision == "happened":
        raise NotForRepeat(
            f"step {d.seq} is a repeated call the guard held, never sent: decide RETRY to let "
            "it run, NOT_HAPPENED to refuse it, or FAIL_RUN"
        )
    payload = json.dumps(step_payload(unknown, d), ensure_ascii=False)
    step = await run(
        conn, "unknown_decision_insert", ws, run_id, d.seq, run_row.lease_epoch, payload
    )
    return run_row, Step.of(step)


async def _why_not(pool: asyncpg.pool.Pool, d: Decision) -> UndecidableError:
    """Why a decision was not recorded, most specific reason first."""
    ws, run_id = d.workspace_id, d.run_id
    run_row = await get_run(pool, ws, run_id)
    if run_row is None:
        return RunNotFound(f"run {run_id} not found")
    step = await run(pool, "unknown_step_get", ws, run_id, d.seq)
    if step is None:
        return StepNotFound(f"run {run_id} has no step {d.seq}")
    winner = await run(pool, "unknown_decision_get", ws, run_id, d.seq)
    if winner is not None and _awaits_person(step) is not None:
        return AlreadyDecided(winner)
    if _awaits_person(step) is None:
        return NotAnUnknown(
            f"step {d.seq} of run {run_id} is a {step['kind']} step, "
            "not an unknown tool outcome awaiting a person"
        )
    return RunNotWaiting(
        f"run {run_id} is {run_row.status}"
        + (f" ({run_row.wait_reason})" if run_row.wait_reason else "")
        + ", not waiting for this decision"
    )
