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


async def list_agents(
    pool: asyncpg.pool.Pool, workspace_id: str, after: str | None, limit: int
) -> list[asyncpg.Record]:
    """Up to `limit` agents by id, after the id `after`."""
    return list(await run(pool, "agent_list", workspace_id, after, limit))
