"""Agents and their immutable versions."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import asyncpg

from control_plane.store.queries import run
from control_plane.store.tools import Pin


async def ensure_workspace(conn: asyncpg.pool.Pool, workspace_id: str) -> None:
    await run(conn, "workspace_ensure", workspace_id)


async def create_agent(
    conn: asyncpg.pool.Pool | asyncpg.Connection,
    workspace_id: str,
    agent_id: str,
    display_name: str,
) -> asyncpg.Record | None:
    """The new agent, or None when the id is taken.

    The workspace exists already: a platform admin created it, and the
    caller's credential belongs to it (nothing creates one implicitly).
    """
    return await run(conn, "agent_insert", workspace_id, agent_id, display_name)


async def get_agent(pool: asyncpg.pool.Pool, workspace_id: str, agent_id: str) -> Any:
    return await run(pool, "agent_get", workspace_id, agent_id)


async def publish_version(
    pool: asyncpg.pool.Pool | asyncpg.Connection,
    workspace_id: str,
    agent_id: str,
    spec: dict[str, Any],
    pins: Sequence[Pin] = (),
    code_tools: Sequence[str] | None = None,
) -> asyncpg.Record | None:
    """The published version, or None when the agent does not exist. `pins`: the registry
    versions it uses; `code_tools`: the built-ins only executors carrying them can run
    (None: every one of spec.tools, as before the registry)."""
    pinned = json.dumps({p.name: p.to_json() for p in pins})
    code = json.dumps(list(code_tools)) if code_tools is not None else None
    return await run(
        pool, "agent_version_publish", workspace_id, agent_id, json.dumps(spec), pinned, code
    )


async def get_version(
    pool: asyncpg.pool.Pool, workspace_id: str, agent_id: str, version: int
) -> asyncpg.Record | None:
    """One version (0 = latest), or None."""
    return await run(pool, "agent_version_get", workspace_id, agent_id, version)


class Versions:
    """Agent versions for admission, cached by one replica. A published version never
    changes and is never deleted, so (workspace, agent, version) -> row is kept (the
    oldest entry goes past `limit`). Which version is the latest is remembered too, but
    only as a guess: an admission of it must check it in its own statement
    (runs.insert_run with latest=True) and, when that fails, read it again
    (`latest(..., fresh=True)`)."""

    def __init__(self, limit: int = 4096) -> None:
        self._limit = limit
        self._rows: dict[tuple[str, str, int], asyncpg.Record] = {}
        self._latest: dict[tuple[str, str], int] = {}

    async def get(
        self, pool: asyncpg.pool.Pool, workspace_id: str, agent_id: str, version: int
    ) -> asyncpg.Record | None:
        """One version (not 0), or None when it was never published."""
        row = self._rows.get((workspace_id, agent_id, version))
        if row is None:
            row = await get_version(pool, workspace_id, agent_id, version)
            if row is not None:
                self._keep(row)
        return row

    async def latest(
        self, pool: asyncpg.pool.Pool, workspace_id: str, agent_id: str, fresh: bool = False
    ) -> asyncpg.Record | None:
        """The latest version as last seen here (fresh: as the database has it now)."""
        seen = None if fresh else self._latest.get((workspace_id, agent_id))
        if seen is not None and (row := self._rows.get((workspace_id, agent_id, seen))):
            return row
        row = await get_version(pool, workspace_id, agent_id, 0)
        if row is not None:
            self._keep(row)
            self._latest[(workspace_id, agent_id)] = row["version"]
        return row

    def _keep(self, row: asyncpg.Record) -> None:
        if len(self._rows) >= self._limit:
            oldest = next(iter(self._rows))
            del self._rows[oldest]
            if self._latest.get(oldest[:2]) == oldest[2]:
                del self._latest[oldest[:2]]
        self._rows[(row["workspace_id"], row["agent_id"], row["version"])] = row


async def list_agents(
    pool: asyncpg.pool.Pool, workspace_id: str, after: str | None, limit: int
) -> list[asyncpg.Record]:
    """Up to `limit` agents by id, after the id `after`."""
    return list(await run(pool, "agent_list", workspace_id, after, limit))
