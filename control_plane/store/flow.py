"""Pending events of debounced and batched triggers, and their groups (sql/flow.sql)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from control_plane.store.admission import Admission
from control_plane.store.db import Connection, Pool, Record
from control_plane.store.queries import run


@dataclass(frozen=True)
class PendingEvent:
    """An event held for its group: `mode` debounce or batch, `wait_seconds` the quiet
    period or the batch's longest wait, `max_events` a batch's size (debounce: 0)."""

    workspace_id: str
    trigger_id: str
    dedupe_key: str
    payload: Any
    flow_key: str
    mode: str
    wait_seconds: int
    max_events: int


async def hold(
    conn: Pool | Connection, ev: PendingEvent, now: datetime | None = None
) -> Record | None:
    """The new pending event (counted in its group), or None on a redelivery."""
    return await run(
        conn,
        "flow_event_hold",
        workspace_id=ev.workspace_id,
        event_id=uuid.uuid4(),
        trigger_id=ev.trigger_id,
        dedupe_key=ev.dedupe_key,
        event_payload=json.dumps(ev.payload),
        flow_key=ev.flow_key,
        mode=ev.mode,
        wait_seconds=ev.wait_seconds,
        max_events=ev.max_events,
        now=now,
    )


async def due_workspaces(
    conn: Connection | Pool, limit: int, now: datetime | None = None
) -> list[str]:
    """Up to `limit` workspaces with a group due, the longest overdue first (no lock)."""
    return [r["workspace_id"] for r in await run(conn, "flow_due_workspaces", now, limit)]


async def claim_due(
    conn: Connection, workspace_id: str, limit: int, now: datetime | None = None
) -> list[Record]:
    """Lock a workspace's due groups for the caller's transaction."""
    return await run(conn, "flow_claim_due", now, limit, workspace_id)


async def take(conn: Connection, group: Any, limit: int) -> list[Record]:
    return await run(
        conn, "flow_take", group["workspace_id"], group["trigger_id"], group["flow_key"], limit
    )


async def consume(
    conn: Connection, event_ids: list[uuid.UUID], adm: Admission, now: datetime | None
) -> int:
    """Admit the run and mark the events accepted with it; how many it took."""
    row = await run(conn, "flow_consume", event_ids=event_ids, **adm.params(now))
    return int(row["consumed"])


async def settle(
    conn: Connection, group: Any, max_events: int, wait_seconds: int, now: datetime | None
) -> None:
    await run(
        conn,
        "flow_group_settle",
        group["workspace_id"],
        group["trigger_id"],
        group["flow_key"],
        max_events,
        wait_seconds,
        now,
    )
