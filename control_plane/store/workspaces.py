"""Workspaces' plans and concurrency caps (the fair claim in lease.py enforces them)."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from control_plane.store.queries import run


class UnknownPlan(ValueError):
    """The plan does not exist, or it has no cap of its own and none was given."""


async def set_plan(
    pool: asyncpg.pool.Pool | asyncpg.Connection,
    workspace_id: str,
    plan: str,
    max_concurrency: int | None = None,
) -> asyncpg.Record:
    """Put the workspace on `plan` (free 2, team 20, enterprise: `max_concurrency`)."""
    try:
        row = await run(pool, "workspace_set_plan", workspace_id, plan, max_concurrency)
    except asyncpg.NotNullViolationError:
        raise UnknownPlan(f"plan {plan!r} has no default cap: give max_concurrency") from None
    if row is None:
        raise UnknownPlan(f"no plan {plan!r}")
    return row


async def get(
    pool: asyncpg.pool.Pool | asyncpg.Connection, workspace_id: str
) -> asyncpg.Record | None:
    return await run(pool, "workspace_get", workspace_id)


async def next_wake(pool: asyncpg.pool.Pool | asyncpg.Connection, workspace_id: str) -> Any:
    """When the claim next looks at the workspace for a due run or an ending lease (a
    datetime; None: nothing to look at)."""
    row = await run(pool, "workspace_next_wake", workspace_id)
    return row["next_wake_at"] if row is not None else None


async def set_wait_limit(
    conn: Any, workspace_id: str, kind: str, seconds: int | None
) -> asyncpg.Record | None:
    """One wait kind's limit (0 = off; None = the platform's default again)."""
    return await run(conn, "workspace_set_wait_limit", workspace_id, kind, seconds)


async def set_approval_watch(
    conn: asyncpg.pool.Pool | asyncpg.Connection, workspace_id: str, watch_json: str | None
) -> asyncpg.Record | None:
    """Set (None: clear) the workspace's approval watch; None if there is no workspace."""
    return await run(conn, "workspace_set_approval_watch", workspace_id, watch_json)


async def set_allowlist(
    conn: asyncpg.pool.Pool | asyncpg.Connection,
    workspace_id: str,
    name: str,
    values_json: str | None,
) -> asyncpg.Record | None:
    """Set (None: remove) one named allowlist; None if there is no workspace."""
    return await run(conn, "workspace_set_allowlist", workspace_id, name, values_json)


async def allowlists(conn: Any, workspace_id: str, names: list[str]) -> dict[str, list[str]]:
    """The workspace's allowlists of these names (those it has), for an assignment."""
    row = await run(conn, "workspace_allowlists", workspace_id, names)
    lists = row["lists"] if row is not None else {}
    if isinstance(lists, str):
        lists = json.loads(lists)
    return {k: [str(v) for v in vs] for k, vs in (lists or {}).items() if isinstance(vs, list)}


async def set_agent_cap(
    pool: asyncpg.pool.Pool, workspace_id: str, agent_id: str, max_concurrency: int | None
) -> asyncpg.Record | None:
    """Cap one agent's concurrent runs (None: only the workspace's cap applies)."""
    return await run(pool, "agent_set_max_concurrency", workspace_id, agent_id, max_concurrency)
