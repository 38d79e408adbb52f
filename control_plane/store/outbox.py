"""The transactional outbox: notifications written with what they announce."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from control_plane.store.queries import run


@dataclass(frozen=True)
class Notification:
    workspace_id: str
    kind: str
    channel: str  # mail | chat (webhook rows are the insert's own)
    recipient: str
    payload: dict[str, Any]
    notification_id: uuid.UUID = field(default_factory=uuid.uuid4)


async def insert(db: Any, note: Notification) -> None:
    await run(
        db,
        "outbox_insert",
        note.workspace_id,
        note.notification_id,
        note.kind,
        note.channel,
        note.recipient,
        json.dumps(note.payload),
    )


async def claim(
    pool: asyncpg.pool.Pool, limit: int, backoff_seconds: float, now: datetime | None = None
) -> list[asyncpg.Record]:
    """Up to `limit` due notifications, each with its next attempt already pushed out.

    Workspace by workspace, the longest waiting first: each claim names one workspace, so
    on Citus it is one statement on one shard (a locking read may not span shards)."""
    rows: list[asyncpg.Record] = []
    for due in await run(pool, "outbox_due_workspaces", limit, now):
        left = limit - len(rows)
        if left <= 0:
            break
        rows += await run(pool, "outbox_claim", left, backoff_seconds, now, due["workspace_id"])
    return rows


async def delivered(
    pool: asyncpg.pool.Pool,
    workspace_id: str,
    notification_id: uuid.UUID,
    receipt: dict[str, Any] | None = None,
) -> None:
    """Mark it delivered, keeping what the channel answered (a Slack message's ts)."""
    answer = json.dumps(receipt) if receipt is not None else None
    await run(pool, "outbox_delivered", workspace_id, notification_id, answer)


async def failed(
    pool: asyncpg.pool.Pool, workspace_id: str, notification_id: uuid.UUID, error: str
) -> None:
    await run(pool, "outbox_failed", workspace_id, notification_id, error[:500])


async def chat_for_approval(
    pool: asyncpg.pool.Pool, workspace_id: str, approval_id: str
) -> list[asyncpg.Record]:
    """The chat notifications an approval has had, with their receipts."""
    return list(await run(pool, "outbox_chat_for_approval", workspace_id, approval_id))
