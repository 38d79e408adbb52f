"""A workspace's remote MCP servers (migrations/0025_mcp_servers.sql); their tools live in
the registry (control_plane/store/tools.py) with `mcp.server_id` naming the server."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeAlias

import asyncpg

from control_plane.store.queries import run

Db: TypeAlias = asyncpg.pool.Pool | asyncpg.Connection


@dataclass(frozen=True)
class McpServerRow:
    workspace_id: str
    server_id: str
    url: str
    connection: str
    created_by: str
    created_at: datetime
    last_sync_at: datetime | None
    timeout_seconds: float

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> McpServerRow:
        return cls(**{name: row[name] for name in cls.__dataclass_fields__})


async def insert(
    db: Db,
    workspace_id: str,
    server_id: str,
    url: str,
    connection: str,
    created_by: str,
    timeout_seconds: float = 0.0,
) -> McpServerRow | None:
    """The new server, or None when the workspace already has one of this id."""
    row = await run(
        db,
        "mcp_server_insert",
        workspace_id=workspace_id,
        server_id=server_id,
        url=url,
        connection=connection,
        created_by=created_by,
        timeout_seconds=timeout_seconds,
    )
    return McpServerRow.from_row(row) if row is not None else None


async def get(db: Db, workspace_id: str, server_id: str) -> McpServerRow | None:
    row = await run(db, "mcp_server_get", workspace_id=workspace_id, server_id=server_id)
    return McpServerRow.from_row(row) if row is not None else None


async def list_for(db: Db, workspace_id: str, limit: int = 500) -> list[McpServerRow]:
    rows = await run(db, "mcp_server_list", workspace_id=workspace_id, limit=limit)
    return [McpServerRow.from_row(r) for r in rows]


async def synced(
    db: Db, workspace_id: str, server_id: str, timeout_seconds: float | None = None
) -> McpServerRow | None:
    """Record a sync that saved its diff (and the calls' new deadline, if given)."""
    row = await run(
        db,
        "mcp_server_synced",
        workspace_id=workspace_id,
        server_id=server_id,
        timeout_seconds=timeout_seconds,
    )
    return McpServerRow.from_row(row) if row is not None else None
