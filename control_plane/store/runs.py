"""Runs: admission, reads, listing and cancellation."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from control_plane.store.admission import Admission
from control_plane.store.db import transaction
from control_plane.store.queries import run


async def insert_run(
    pool: asyncpg.pool.Pool, adm: Admission, now: datetime | None = None
) -> asyncpg.Record | None:
    """The new run (with its input step), or None when request_id was used."""
    return await run(pool, "run_insert", **adm.params(now))


async def get_run(
    pool: asyncpg.pool.Pool, workspace_id: str, run_id: uuid.UUID
) -> asyncpg.Record | None:
    return await run(pool, "run_get", workspace_id, run_id)


async def get_run_by_request(
    pool: asyncpg.pool.Pool, workspace_id: str, agent_id: str, request_id: str
) -> asyncpg.Record | None:
    return await run(pool, "run_get_by_request", workspace_id, agent_id, request_id)


@dataclass(frozen=True)
class RunPage:
    runs: list[asyncpg.Record]
    has_more: bool


async def list_runs(
    pool: asyncpg.pool.Pool,
    workspace_id: str,
    *,
    after: tuple[datetime, uuid.UUID] | None,
    agent_id: str | None,
    status: str | None,
    limit: int,
) -> RunPage:
    """A page of runs, newest first, after the keyset cursor."""
    created, run_id = after if after else (None, None)
    rows = await run(pool, "run_list", workspace_id, created, run_id, agent_id, status, limit + 1)
    return RunPage(runs=rows[:limit], has_more=len(rows) > limit)


async def cancel_run(
    pool: asyncpg.pool.Pool | asyncpg.Connection,
    workspace_id: str,
    run_id: uuid.UUID,
    reason: str,
    now: datetime | None = None,
) -> asyncpg.Record | None:
    """The cancelled run, or None when it does not exist or already ended.

    The finish step takes the next seq; a commit racing in between makes that
    seq collide, so the cancel is simply tried again.
    """
    for _ in range(5):
        try:
            async with transaction(pool) as conn:  # in the caller's transaction: a savepoint
                return await run(conn, "run_cancel", workspace_id, run_id, reason, now)
        except asyncpg.UniqueViolationError:
            continue
    raise RuntimeError("cancel kept colliding with concurrent commits")
