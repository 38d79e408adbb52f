"""Schedule state beyond the next slot: overlap buffers, pause notes, updates, deletion
(sql/schedules.sql)."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

from control_plane.store.db import Connection, Pool, Record
from control_plane.store.queries import run


async def active_runs(
    conn: Pool | Connection, workspace_id: str, trigger_id: str, agent_id: str
) -> list[tuple[uuid.UUID, str]]:
    """(run id, status) of the schedule's runs still going, oldest first."""
    rows = await run(conn, "schedule_active_runs", workspace_id, trigger_id, agent_id)
    return [(r["run_id"], r["status"]) for r in rows]


async def lock(
    conn: Connection, workspace_id: str, trigger_id: str, now: datetime | None = None
) -> Record | None:
    """The schedule locked for the caller's transaction (with `db_now`), or None."""
    return await run(conn, "schedule_lock", workspace_id, trigger_id, now)


async def buffer(
    conn: Connection, workspace_id: str, trigger_id: str, slot: datetime, dedupe_key: str
) -> None:
    await run(conn, "schedule_buffer", workspace_id, trigger_id, slot, dedupe_key)


async def unbuffer(conn: Connection, workspace_id: str, trigger_id: str) -> None:
    await run(conn, "schedule_unbuffer", workspace_id, trigger_id)


async def buffered_workspaces(conn: Connection | Pool, limit: int) -> list[str]:
    """Up to `limit` workspaces with a buffered slot that may fire now (no lock)."""
    return [r["workspace_id"] for r in await run(conn, "schedule_buffered_workspaces", limit)]


async def claim_buffered(
    conn: Connection, workspace_id: str, limit: int, now: datetime | None = None
) -> list[Record]:
    """Lock a workspace's schedules whose buffered slot may fire now (no run of theirs
    still going)."""
    return await run(conn, "schedule_claim_buffered", now, limit, workspace_id)


async def update(
    conn: Pool | Connection,
    workspace_id: str,
    trigger_id: str,
    config: dict[str, Any],
    next_slot: datetime,
    next_fire: datetime,
) -> Record | None:
    return await run(
        conn, "schedule_update", workspace_id, trigger_id, json.dumps(config), next_slot, next_fire
    )


async def pause(
    conn: Pool | Connection,
    workspace_id: str,
    trigger_id: str,
    enabled: bool,
    note: str | None,
    next_slot: datetime | None = None,
    next_fire: datetime | None = None,
) -> Record | None:
    """Pause or unpause with a note (a schedule unpaused moves to `next_slot`)."""
    return await run(
        conn, "trigger_pause", workspace_id, trigger_id, enabled, note, next_slot, next_fire
    )


async def delete(conn: Pool | Connection, workspace_id: str, trigger_id: str) -> Record | None:
    """Delete the trigger, its secrets and its events; None when there is none."""
    return await run(conn, "trigger_delete", workspace_id, trigger_id)


async def lock_any(conn: Connection, workspace_id: str, trigger_id: str) -> Record | None:
    """A trigger of any kind, locked for the caller's transaction."""
    return await run(conn, "trigger_lock", workspace_id, trigger_id)


async def get_any(conn: Pool | Connection, workspace_id: str, trigger_id: str) -> Record | None:
    return await run(conn, "trigger_get", workspace_id, trigger_id)
