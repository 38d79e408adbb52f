"""Retention: deleting a workspace's old finished runs, a bounded batch per statement."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg

from control_plane.store.db import Pool
from control_plane.store.queries import run

__all__ = ["Deleted", "Pool", "delete_batch", "due_workspaces", "set_days"]


@dataclass(frozen=True)
class Deleted:
    """What one batch deleted."""

    runs: int
    steps: int
    events: int
    payloads: int
    audit: int


async def due_workspaces(pool: Pool, now: datetime | None) -> list[tuple[str, datetime]]:
    """The workspaces with a retention period, and each one's cutoff at `now` (the
    database's clock when None)."""
    rows = await run(pool, "retention_workspaces", now=now)
    return [(r["workspace_id"], r["cutoff"]) for r in rows]


async def delete_batch(
    pool: Pool, workspace_id: str, cutoff: datetime, batch: int, steps: int = 10_000
) -> Deleted:
    """Delete up to `batch` runs of the workspace finished before `cutoff` (runs other
    transactions hold are skipped), with their steps, events, payloads and audit rows; no
    more runs than keep the step rows deleted at about `steps` (at least one run)."""
    row = await run(
        pool, "retention_delete_batch", ws=workspace_id, cutoff=cutoff, batch=batch, steps=steps
    )
    return Deleted(row["runs"], row["steps"], row["events"], row["payloads"], row["audit"])


async def set_days(
    conn: Pool | asyncpg.Connection, workspace_id: str, days: int
) -> asyncpg.Record | None:
    """Keep the workspace's finished runs `days` days (0: forever); None if no workspace."""
    return await run(conn, "workspace_set_retention", ws=workspace_id, days=days)
