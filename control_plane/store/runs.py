"""Runs: admission, reads, listing and cancellation."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from control_plane.store.queries import run


@dataclass(frozen=True)
class Admission:
    """Everything copied onto a run when it is admitted."""

    workspace_id: str
    agent_id: str
    agent_version: int
    input: str
    request_id: str | None
    max_steps: int
    max_tokens: int
    max_tool_calls: int
    deadline_seconds: int  # of active time (held by executors)
    model_retry_budget: int = 30
    max_age_seconds: int = 0  # of the run as a whole; 0 = none
    # The label of the principal who started the run (`key:ci-bot`, `person:ada@…`).
    started_by: str | None = None


async def insert_run(
    pool: asyncpg.pool.Pool, adm: Admission, now: datetime | None = None
) -> asyncpg.Record | None:
    """The new run (with its input step), or None when request_id was used."""
    return await run(
        pool, "run_insert", adm.workspace_id, uuid.uuid4(), adm.agent_id, adm.agent_version,
        adm.request_id, adm.input, adm.max_steps, adm.max_tokens, adm.max_tool_calls,
        adm.deadline_seconds, now, adm.model_retry_budget, adm.max_age_seconds, adm.started_by,
    )  # fmt: skip


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
) -> asyncpg.Record | None:
    """The cancelled run, or None when it does not exist or already ended.

    The finish step takes the next seq; a commit racing in between makes that
    seq collide, so the cancel is simply tried again.
    """
    for _ in range(5):
        try:
            if isinstance(pool, asyncpg.Connection):  # the caller's transaction: a savepoint
                async with pool.transaction():
                    return await run(pool, "run_cancel", workspace_id, run_id, reason)
            return await run(pool, "run_cancel", workspace_id, run_id, reason)
        except asyncpg.UniqueViolationError:
            continue
    raise RuntimeError("cancel kept colliding with concurrent commits")
