"""Runs: admission, reads, listing and cancellation."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime

import asyncpg

from control_plane.store import records
from control_plane.store.admission import Admission
from control_plane.store.db import transaction
from control_plane.store.queries import run


@dataclass(frozen=True)
class Run:
    """One run, as stored (every column of `runs`), read at the store's edge.

    Every query that returns a run returns the whole row and `held_seconds`: the current
    hold's seconds so far on the database clock (0 unless running), which the API adds to
    active_seconds.
    """

    workspace_id: str
    run_id: uuid.UUID
    agent_id: str
    agent_version: int
    status: str
    wait_reason: str | None
    wake_at: datetime | None  # runnable at; while running, the lease expiry
    lease_owner: str | None
    lease_epoch: int
    attempt: int
    request_id: str | None
    input: str
    output: str | None
    error: str | None
    # Limits copied at admission.
    max_steps: int
    max_tokens: int
    max_tool_calls: int
    deadline_seconds: int  # of active time
    model_retry_budget: int
    max_age_seconds: int  # 0: none
    expires_at: datetime | None  # admission + max age
    repeat_limit: int
    context_tokens: int  # 0: prompts are never summarised
    # Counters.
    step_count: int
    model_calls: int
    tool_calls: int
    tokens_used: int
    active_seconds: float  # of ended holds
    held_since: datetime | None
    started_by: str | None
    # The connection a `connection` wait is for (reconnecting it wakes the run).
    waiting_connection_id: uuid.UUID | None
    # A child run's parent and the seq of the start_child call that admitted it.
    parent_run_id: uuid.UUID | None
    parent_seq: int | None
    # A fork's source run and the last seq copied from its log (control_plane/runs/forks.py).
    forked_from_run_id: uuid.UUID | None
    forked_from_seq: int | None
    # Usage and cost priced at commit (control_plane/credits/pricing.py); credits this run reserved.
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    reasoning_tokens: int
    cost_micros: int
    credits_reserved_micros: int
    credit_chunks: int
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    held_seconds: float  # computed by the query, not a column
    # The release of the executor that first claimed it (None: not claimed yet).
    release: str | None = None
    # Higher goes first within its workspace's fair share (0026_run_priority.sql).
    priority: int = 0
    # The step-log version it was last written in (0037_release_pins.sql).
    log_version: int = 1
    # Calls an argument constraint refused (0041_refusal_outcomes_and_workspace_allowlists.sql, issue 48).
    refused_calls: int = 0
    # Set at admission and by its set_metadata calls; paused by PauseRun (0045_orchestration.sql).
    tags: list[str] = field(default_factory=list)
    metadata: str = "{}"  # a JSON object's text
    paused: bool = False
    # A start_children child's place in its call's list, and what its parent's close does
    # to it; a parent whose close cancels children (0048_fan_out.sql).
    parent_index: int | None = None
    parent_close: str | None = None
    closes_children: bool = False
    # A keyed run's concurrency key, and whether it holds one of the key's slots
    # (0050_concurrency_keys.sql); None: its version declares no key.
    concurrency_key: str | None = None
    key_slot: bool = False
    # The session whose turn this run is, or is below (a child, a fork): who may see it
    # when that session is private (0053_run_session.sql); None: no session's.
    session_id: uuid.UUID | None = None
    # The concurrency_key rule (JSON text) of the trigger that started it, read at its
    # admission instead of its version's (0054_trigger_concurrency_keys.sql); None: the
    # version's.
    key_rule: str | None = None

    @classmethod
    def from_record(cls, record: asyncpg.Record) -> Run:
        """The run of a row that has every column (a KeyError names one that is missing)."""
        return records.one(cls, _RUN_FIELDS, record)

    @classmethod
    def from_records(cls, rows: Sequence[asyncpg.Record]) -> list[Run]:
        """from_record of each of `rows`, rows of one query, by position (records.each)."""
        return records.each(cls, _RUN_FIELDS, rows)


# Read once: dataclasses.fields() rebuilds its tuple on every call, and every claimed,
# read or listed run goes through from_record.
_RUN_FIELDS = tuple(f.name for f in fields(Run))


def _run_or_none(record: asyncpg.Record | None) -> Run | None:
    return Run.from_record(record) if record is not None else None


async def insert_run(
    pool: asyncpg.pool.Pool, adm: Admission, now: datetime | None = None, latest: bool = False
) -> Run | None:
    """The new run (with its input step), or None when request_id was used; with `latest`,
    also None when adm.agent_version is no longer the agent's latest (run_insert_latest)."""
    query = "run_insert_latest" if latest else "run_insert"
    return _run_or_none(await run(pool, query, **adm.params(now)))


async def get_run(
    pool: asyncpg.pool.Pool | asyncpg.Connection, workspace_id: str, run_id: uuid.UUID
) -> Run | None:
    return _run_or_none(await run(pool, "run_get", workspace_id, run_id))


async def get_run_by_request(
    pool: asyncpg.pool.Pool, workspace_id: str, agent_id: str, request_id: str
) -> Run | None:
    return _run_or_none(await run(pool, "run_get_by_request", workspace_id, agent_id, request_id))


@dataclass(frozen=True)
class RunPage:
    runs: list[Run]
    has_more: bool


async def list_runs(
    pool: asyncpg.pool.Pool,
    workspace_id: str,
    *,
    after: tuple[datetime, uuid.UUID] | None,
    agent_id: str | None,
    status: str | None,
    limit: int,
    created_since: datetime | None = None,
    search: str | None = None,
    waiting_longer_than: float | None = None,
    tag: str | None = None,
    metadata: str | None = None,
    reader: str | None = None,
) -> RunPage:
    """A page of runs, newest first, after the keyset cursor; `tag` reads the tag index
    (run_list_tagged); `metadata` is a JSON object the run's metadata must contain; only the
    runs `reader` may see (None: every run; control_plane/auth/privacy.py)."""
    created, run_id = after if after else (None, None)
    rows = await run(
        pool,
        "run_list_tagged" if tag else "run_list",
        workspace_id,
        created,
        run_id,
        agent_id,
        status,
        limit + 1,
        created_since,
        search,
        waiting_longer_than,
        metadata,
        reader,
        *([tag] if tag else []),
    )
    return RunPage(runs=Run.from_records(rows[:limit]), has_more=len(rows) > limit)


async def cancel_run(
    pool: asyncpg.pool.Pool | asyncpg.Connection,
    workspace_id: str,
    run_id: uuid.UUID,
    reason: str,
    now: datetime | None = None,
) -> Run | None:
    """The cancelled run, or None when it does not exist or already ended.

    The finish step takes the next seq; a commit racing in between makes that
    seq collide, so the cancel is simply tried again. So is a deadlock: cancelling a
    parent cancels its children (migrations/0048_fan_out.sql), and a child ending at
    that moment locks itself, then its parent.
    """
    for _ in range(5):
        try:
            async with transaction(pool) as conn:  # in the caller's transaction: a savepoint
                return _run_or_none(
                    await run(conn, "run_cancel", workspace_id, run_id, reason, now)
                )
        except (asyncpg.UniqueViolationError, asyncpg.DeadlockDetectedError):
            continue
    raise RuntimeError("cancel kept colliding with concurrent commits")
