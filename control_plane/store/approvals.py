"""Approvals: held tool calls, the decision compare-and-set, expiry, tokens."""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any

import asyncpg

from control_plane.store import outbox
from control_plane.store.errors import StoreError
from control_plane.store.queries import run


@dataclass(frozen=True)
class Approval:
    """One held tool call and its decision, as stored (every column of `approvals`)."""

    workspace_id: str
    approval_id: uuid.UUID
    run_id: uuid.UUID
    decision_seq: int
    call_id: str
    tool: str
    arguments: str  # JSON text, the arguments asked for
    arguments_sha256: str
    approvers: list[str]
    slack_approvers: list[str]
    high_risk: bool
    moves_money: bool
    expire_at: datetime
    expiry_seconds: int
    on_expiry: str  # reject | escalate | remind
    escalate_to: list[str]
    max_reminders: int
    escalation_level: int
    reminders_sent: int
    decision: str | None  # None while pending: approved | rejected | edited | expired
    decided_by: str | None
    decided_at: datetime | None
    reason: str | None
    edited_arguments: str | None  # JSON text of an edit
    created_at: datetime
    # JSON text: where untrusted argument values first appeared ("[]" for most).
    argument_origins: str = "[]"

    @classmethod
    def from_record(cls, record: asyncpg.Record) -> Approval:
        """The approval of a row that has every column (a KeyError names one that is missing)."""
        return cls(**{f.name: record[f.name] for f in fields(cls)})


def _approval_or_none(record: asyncpg.Record | None) -> Approval | None:
    return Approval.from_record(record) if record is not None else None


class DecisionLost(StoreError):
    """Another decision won the compare-and-set; carries the winning approval."""

    def __init__(self, winner: Approval) -> None:
        super().__init__(f"approval already {winner.decision} by {winner.decided_by}")
        self.winner = winner


class RunNotWaiting(StoreError):
    """The approval's run no longer waits for it (cancelled or finished)."""


@dataclass(frozen=True)
class NewApproval:
    workspace_id: str
    approval_id: uuid.UUID
    run_id: uuid.UUID
    decision_seq: int
    call_id: str
    tool: str
    arguments_json: str
    arguments_sha256: str
    approvers: list[str]
    slack_approvers: list[str]
    high_risk: bool
    moves_money: bool
    expiry_seconds: int
    on_expiry: str
    escalate_to: list[str]
    max_reminders: int
    argument_origins_json: str = "[]"


async def run_spec(db: Any, workspace_id: str, run_id: uuid.UUID) -> dict[str, Any] | None:
    row = await run(db, "run_agent_spec", workspace_id, run_id)
    return json.loads(row["spec"]) if row else None


async def insert(
    conn: asyncpg.Connection,
    approval: NewApproval,
    notify: list[outbox.Notification],
    now: datetime | None = None,
) -> None:
    """The approval and its notifications, in the caller's transaction: the commit's that
    holds the proposed call (approvals/commit.py)."""
    # NewApproval's fields are the statement's parameter names.
    await run(conn, "approval_insert", **asdict(approval), now=now)
    for note in notify:
        await outbox.insert(conn, note)


@dataclass(frozen=True)
class RunGuard:
    """The run-level rules of a decision: four eyes, and who started the run."""

    four_eyes: bool
    started_by: str | None  # a principal label, `kind:name`

    @property
    def starter_name(self) -> str | None:
        return self.started_by.split(":", 1)[-1] if self.started_by else None


async def run_guard(db: Any, workspace_id: str, run_id: uuid.UUID) -> RunGuard:
    row = await run(db, "approval_run_guard", workspace_id, run_id)
    return RunGuard(bool(row and row["four_eyes"]), row["started_by"] if row else None)


async def get(db: Any, workspace_id: str, approval_id: uuid.UUID) -> Approval | None:
    return _approval_or_none(await run(db, "approval_get", workspace_id, approval_id))


async def list_page(
    pool: asyncpg.pool.Pool,
    workspace_id: str,
    *,
    approver: str | None,
    state: str | None,
    after: tuple[datetime, uuid.UUID] | None,
    limit: int,
) -> tuple[list[Approval], bool]:
    created, last_id = after if after else (None, None)
    rows = await run(
        pool, "approval_list", workspace_id, approver, state, created, last_id, limit + 1
    )
    return [Approval.from_record(r) for r in rows[:limit]], len(rows) > limit


# What the database records on a pending approval whose run ended (migration 0042's trigger).
CLOSED = "closed"


@dataclass(frozen=True)
class Decision:
    decision: str  # approved | rejected | edited | expired (closed: only the database)
    decided_by: str
    reason: str | None = None
    edited_arguments_json: str | None = None


async def decide(
    conn: asyncpg.Connection,
    workspace_id: str,
    approval_id: uuid.UUID,
    d: Decision,
    step_payload: dict[str, Any],
    now: datetime | None = None,
) -> Approval:
    """The compare-and-set plus its step and the run's wake, inside the caller's transaction.

    Raises DecisionLost when another decision won, RunNotWaiting when the run
    no longer waits for this approval.
    """
    current = _approval_or_none(await run(conn, "approval_lock", workspace_id, approval_id))
    if current is None:
        raise LookupError(approval_id)
    lock = await run(conn, "approval_run_lock", workspace_id, current.run_id)
    decided = _approval_or_none(
        await run(
            conn,
            "approval_decide",
            workspace_id,
            approval_id,
            d.decision,
            d.decided_by,
            d.reason,
            d.edited_arguments_json,
            now,
        )
    )
    if decided is None:
        winner = await get(conn, workspace_id, approval_id)
        assert winner is not None  # locked above; approvals are never deleted
        raise DecisionLost(winner)
    if lock["status"] != "waiting" or lock["wait_reason"] != "approval":
        raise RunNotWaiting(f"run {current.run_id} is {lock['status']}")
    assert decided.decided_at is not None  # the compare-and-set sets it
    payload = {**step_payload, "decided_at": decided.decided_at.isoformat()}
    await run(
        conn,
        "approval_decision_step",
        workspace_id,
        decided.run_id,
        lock["next_seq"],
        lock["lease_epoch"],
        decided.decision_seq,
        json.dumps(payload),
        now,
    )
    return decided


async def expired_workspaces(
    conn: asyncpg.Connection | asyncpg.pool.Pool, limit: int, now: datetime | None = None
) -> list[str]:
    """Up to `limit` workspaces with a pending approval past its expiry (no lock)."""
    return [r["workspace_id"] for r in await run(conn, "approvals_expired_workspaces", limit, now)]


async def lock_expired(
    conn: asyncpg.Connection, workspace_id: str, limit: int, now: datetime | None = None
) -> list[Approval]:
    """Up to `limit` of a workspace's expired pending approvals, locked."""
    rows = await run(conn, "approvals_expired", limit, now, workspace_id)
    return [Approval.from_record(r) for r in rows]


async def extend(
    conn: asyncpg.Connection,
    workspace_id: str,
    approval_id: uuid.UUID,
    *,
    approvers: list[str] | None,
    escalate: bool,
    remind: bool,
    now: datetime | None = None,
) -> Approval | None:
    return _approval_or_none(
        await run(
            conn,
            "approval_extend",
            workspace_id,
            approval_id,
            approvers,
            int(escalate),
            int(remind),
            now,
        )
    )


async def insert_token(
    db: Any,
    workspace_id: str,
    token_sha256: bytes,
    approval_id: uuid.UUID,
    approver: str,
    expires_at: datetime,
) -> None:
    await run(
        db, "approval_token_insert", workspace_id, token_sha256, approval_id, approver, expires_at
    )


async def peek_token(
    db: Any, workspace_id: str, token_sha256: bytes, now: datetime | None = None
) -> asyncpg.Record | None:
    return await run(db, "approval_token_peek", workspace_id, token_sha256, now)


async def use_token(
    db: Any, workspace_id: str, token_sha256: bytes, now: datetime | None = None
) -> asyncpg.Record | None:
    return await run(db, "approval_token_use", workspace_id, token_sha256, now)


async def close_without_step(
    conn: asyncpg.Connection,
    workspace_id: str,
    approval_id: uuid.UUID,
    d: Decision,
    now: datetime | None = None,
) -> Approval | None:
    return _approval_or_none(
        await run(
            conn,
            "approval_close",
            workspace_id,
            approval_id,
            d.decision,
            d.decided_by,
            d.reason,
            now,
        )
    )
