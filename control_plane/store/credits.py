"""Credit accounts, the ledger, and the runs' reservations (sql/credits.sql)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, fields
from datetime import datetime

import asyncpg

from control_plane.store.db import Connection, Pool, transaction
from control_plane.store.queries import run


@dataclass(frozen=True)
class Account:
    """A workspace's credit account; granted = balance + reserved + spent, always."""

    workspace_id: str
    granted_micros: int
    balance_micros: int
    reserved_micros: int
    spent_micros: int
    chunk_micros: int
    out_of_credits: str  # 'park' or 'fail'
    updated_at: datetime

    @classmethod
    def of(cls, row: asyncpg.Record) -> Account:
        return cls(**{f.name: row[f.name] for f in fields(cls)})


@dataclass(frozen=True)
class Entry:
    """One ledger entry (grant, reserve, spend or release)."""

    workspace_id: str
    entry_id: int
    kind: str
    run_id: uuid.UUID | None
    chunk: int
    amount_micros: int
    granted_by: str | None
    note: str
    created_at: datetime

    @classmethod
    def of(cls, row: asyncpg.Record) -> Entry:
        return cls(**{f.name: row[f.name] for f in fields(cls)})


@dataclass(frozen=True)
class Reservation:
    """What a reservation did: the run goes on ('running') or stopped, and why."""

    status: str
    reason: str | None
    reserved_micros: int


async def reserve(
    db: Pool | Connection, workspace_id: str, run_id: uuid.UUID, epoch: int, *, may_stop: bool
) -> Reservation | None:
    """Reserve the next chunk for a run held at `epoch` that owes one, or (if `may_stop`)
    stop the run. None: nothing owed or the workspace is unlimited. Safe to repeat."""
    row = await run(
        db,
        "credits_reserve",
        workspace_id=workspace_id,
        run_id=run_id,
        epoch=epoch,
        may_stop=may_stop,
    )
    if row is None:
        return None
    reason = None if row["status"] == "running" else row["error"] or _parked_reason(workspace_id)
    return Reservation(row["status"], reason, row["reserved_micros"])


def _parked_reason(workspace_id: str) -> str:
    return f"out of credits: workspace {workspace_id}'s run parked until credits are granted"


async def grant(
    db: Pool | Connection,
    workspace_id: str,
    amount_micros: int,
    granted_by: str,
    *,
    note: str = "",
    chunk_micros: int | None = None,
    out_of_credits: str | None = None,
) -> Account:
    """Add credits (creating the account), and wake the runs parked for credits."""
    async with transaction(db) as conn:
        # The runs first, then the account: the lock order every credit statement keeps.
        await run(conn, "credits_wake_parked", workspace_id)
        row = await run(
            conn,
            "credits_grant",
            workspace_id=workspace_id,
            amount=amount_micros,
            chunk=chunk_micros,
            policy=out_of_credits,
            granted_by=granted_by,
            note=note,
        )
    return Account.of(row)


async def account(pool: Pool, workspace_id: str) -> Account | None:
    row = await run(pool, "credits_account", workspace_id)
    return Account.of(row) if row is not None else None


async def ledger_page(
    pool: Pool,
    workspace_id: str,
    before: int | None,
    limit: int,
    run_id: uuid.UUID | None = None,
) -> list[Entry]:
    """Entries newest first, before entry `before` (None: from the newest)."""
    rows = await run(pool, "credits_ledger_page", workspace_id, before, run_id, limit)
    return [Entry.of(r) for r in rows]
