"""The tools connected executors carry (migrations/0009_guardrails.sql), shared by replicas."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, TypeAlias

import asyncpg

from control_plane.store.queries import run

Pool: TypeAlias = asyncpg.pool.Pool


async def record(
    pool: Pool,
    executor_id: str,
    session_id: str,
    release: str,
    scope: Iterable[str] | None,
    tools: Sequence[dict[str, Any]],
) -> None:
    """An executor connected (or reconnected) carrying `tools`."""
    allowed = sorted(scope) if scope is not None else None
    await run(
        pool,
        "executor_tools_upsert",
        executor_id,
        session_id,
        release,
        allowed,
        json.dumps(list(tools)),
    )


async def touch(pool: Pool, session_ids: list[str]) -> None:
    """The executors of these streams are still connected."""
    if session_ids:
        await run(pool, "executor_tools_touch", session_ids)


async def forget(pool: Pool, session_id: str) -> None:
    """The stream `session_id` ended: what its executor declared no longer counts."""
    await run(pool, "executor_tools_forget", session_id)


async def live_for(
    conn: Pool | asyncpg.Connection, workspace_id: str, live_seconds: float
) -> list[tuple[str, list[dict[str, Any]]]]:
    """(executor id, declared tools) of each live executor that may serve the workspace."""
    rows = await run(conn, "executor_tools_live_for", workspace_id, live_seconds)
    return [(r["executor_id"], json.loads(r["tools"])) for r in rows]
