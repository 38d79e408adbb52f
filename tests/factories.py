"""Builders for test data, written through the store (never raw table inserts)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import asyncpg

from control_plane.store import agents, runs

DEFAULT_SPEC = {
    "instructions": "test agent",
    "model": "writer",
    "tools": ["crm_lookup", "send_email", "echo", "sleep"],
    "limits": {},
}


async def agent_version(
    pool: asyncpg.pool.Pool,
    workspace_id: str = "ws",
    agent_id: str = "agent",
    spec: dict | None = None,
) -> int:
    """Create (if needed) the workspace and agent and publish a version; returns the version."""
    await agents.ensure_workspace(pool, workspace_id)
    await agents.create_agent(pool, workspace_id, agent_id, agent_id)
    row = await agents.publish_version(pool, workspace_id, agent_id, spec or DEFAULT_SPEC)
    return row["version"]


async def queued_runs(
    pool: asyncpg.pool.Pool,
    n: int,
    workspace_id: str = "ws",
    agent_id: str = "agent",
    deadline_seconds: int = 3600,
) -> list[runs.Run]:
    """Admit n runs of a fresh agent version."""
    version = await agent_version(pool, workspace_id, agent_id)
    out = []
    for i in range(n):
        adm = runs.Admission(
            workspace_id=workspace_id,
            agent_id=agent_id,
            agent_version=version,
            input=f"input {i}",
            request_id=None,
            max_steps=50,
            max_tokens=100_000,
            max_tool_calls=100,
            deadline_seconds=deadline_seconds,
        )
        run = await runs.insert_run(pool, adm)
        assert run is not None
        out.append(run)
    return out


async def many_runs(
    pool: asyncpg.pool.Pool,
    n: int,
    start: datetime,
    workspace_id: str = "ws",
    agent_id: str = "agent",
    same_instant: int = 1,
    concurrency: int = 8,
) -> list[runs.Run]:
    """Admit n runs of a fresh agent version fast (concurrent inserts through the store),
    created a millisecond apart from `start` on, `same_instant` runs sharing each instant
    (ties a keyset must break by run id). Nobody runs them: they stay queued."""
    version = await agent_version(pool, workspace_id, agent_id)
    out: list[runs.Run] = []

    async def admit(i: int) -> None:
        adm = runs.Admission(
            workspace_id=workspace_id,
            agent_id=agent_id,
            agent_version=version,
            input=f"input {i}",
            request_id=None,
            max_steps=50,
            max_tokens=100_000,
            max_tool_calls=100,
            deadline_seconds=3600,
        )
        at = start + timedelta(milliseconds=i // same_instant)
        run = await runs.insert_run(pool, adm, now=at)
        assert run is not None
        out.append(run)

    for batch in range(0, n, concurrency * 25):
        chunk = range(batch, min(batch + concurrency * 25, n))
        await asyncio.gather(*(admit(i) for i in chunk))
    return out
