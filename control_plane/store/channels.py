"""A workspace's notification channels (sql/channels.sql, migration 0042)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from control_plane.store.queries import run

KINDS = ("slack", "email", "webhook")
# Which channel kind delivers an outbox row of each channel.
FOR_ROW = {"chat": "slack", "mail": "email"}


@dataclass(frozen=True)
class Channel:
    workspace_id: str
    channel_id: uuid.UUID
    kind: str
    name: str
    config: dict[str, Any]
    secret_sealed: bytes | None
    created_at: datetime
    lifecycle_cursor: datetime | None = None

    @classmethod
    def of(cls, record: asyncpg.Record | None) -> Channel | None:
        if record is None:
            return None
        return cls(**{**dict(record), "config": json.loads(record["config"])})


async def insert(
    db: Any,
    workspace_id: str,
    channel_id: uuid.UUID,
    kind: str,
    name: str,
    config: dict[str, Any],
    secret_sealed: bytes | None,
) -> Channel | None:
    """The new channel; None when the name is taken."""
    row = await run(
        db,
        "channel_insert",
        workspace_id,
        channel_id,
        kind,
        name,
        json.dumps(config),
        secret_sealed,
    )
    return Channel.of(row)


async def list_all(db: Any, workspace_id: str) -> list[Channel]:
    return [c for c in map(Channel.of, await run(db, "channel_list", workspace_id)) if c]


async def get(db: Any, workspace_id: str, channel_id: uuid.UUID) -> Channel | None:
    return Channel.of(await run(db, "channel_get", workspace_id, channel_id))


async def of_kind(db: Any, workspace_id: str, kind: str) -> Channel | None:
    return Channel.of(await run(db, "channel_of_kind", workspace_id, kind))


async def delete(db: Any, workspace_id: str, name: str) -> bool:
    return await run(db, "channel_delete", workspace_id, name) is not None
