"""Claims, heartbeats and lease hand-back: the run row as a lease."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from control_plane.store.queries import run


@dataclass(frozen=True)
class LeaseKey:
    workspace_id: str
    run_id: uuid.UUID
    epoch: int


async def claim_due(
    pool: asyncpg.pool.Pool, owners: list[str], lease_seconds: float, now: datetime | None = None
) -> list[asyncpg.Record]:
    """Claim up to len(owners) due runs; run i is leased to owners[i]."""
    if not owners:
        return []
    return await run(pool, "run_claim_due", owners, lease_seconds, now)


def _columns(leases: list[LeaseKey]) -> tuple[list[str], list[uuid.UUID], list[int]]:
    return (
        [lease.workspace_id for lease in leases],
        [lease.run_id for lease in leases],
        [lease.epoch for lease in leases],
    )


@dataclass(frozen=True)
class HeartbeatOutcome:
    renewed: dict[LeaseKey, datetime]
    past_deadline: set[LeaseKey]


async def heartbeat(
    pool: asyncpg.pool.Pool, owner: str, leases: list[LeaseKey], lease_seconds: float
) -> HeartbeatOutcome:
    """Renew the leases still held; fail those whose deadline passed."""
    if not leases:
        return HeartbeatOutcome({}, set())
    cols = _columns(leases)
    rows = await run(pool, "run_heartbeat", owner, *cols, lease_seconds)
    renewed = {
        LeaseKey(r["workspace_id"], r["run_id"], r["lease_epoch"]): r["wake_at"] for r in rows
    }
    refused = [lease for lease in leases if lease not in renewed]
    past: set[LeaseKey] = set()
    if refused:
        for _ in range(5):
            try:
                failed = await run(pool, "run_fail_past_deadline", *_columns(refused))
                break
            except asyncpg.UniqueViolationError:
                continue
        else:
            failed = []
        past = {LeaseKey(r["workspace_id"], r["run_id"], r["lease_epoch"]) for r in failed}
    return HeartbeatOutcome(renewed, past)


async def release_unassigned(pool: asyncpg.pool.Pool, lease: LeaseKey) -> None:
    """Make a claimed-but-undelivered run runnable again now."""
    await run(pool, "run_release_unassigned", lease.workspace_id, lease.run_id, lease.epoch)
