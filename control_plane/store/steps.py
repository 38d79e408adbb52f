"""The step log: fenced, idempotent commits and reads."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

import asyncpg

import faults
from control_plane.store import records
from control_plane.store.db import Lane, in_transaction, transaction
from control_plane.store.errors import CommitConflict, Fenced, transient
from control_plane.store.queries import run


@dataclass(frozen=True)
class Step:
    """One step of a run's log, as stored."""

    workspace_id: str
    run_id: uuid.UUID
    seq: int
    kind: str
    epoch: int  # the lease epoch it was written under (0: the input step)
    ref_seq: int | None
    payload: str  # JSON text, as the executor wrote it
    created_at: datetime
    release: str | None = None  # the release that wrote it (None: the platform)

    @classmethod
    def of(cls, row: asyncpg.Record) -> Step:
        return records.one(cls, _STEP_FIELDS, row)  # as Run.from_record

    @classmethod
    def of_rows(cls, rows: Sequence[asyncpg.Record]) -> list[Step]:
        """Step.of of each of `rows`, rows of one query, by position (records.each)."""
        return records.each(cls, _STEP_FIELDS, rows)


_STEP_FIELDS = tuple(f.name for f in fields(Step))  # read once, as runs.py's


@dataclass(frozen=True)
class NewStep:
    seq: int
    kind: str
    ref_seq: int | None
    payload_json: str


@dataclass(frozen=True)
class Transition:
    """None status renews the lease; 'waiting', 'completed', 'failed' release it."""

    status: str | None = None
    wait_reason: str | None = None
    wake_at: datetime | None = None
    wake_after_seconds: float | None = None
    text: str | None = None  # output (completed) or error (failed)
    # With wait_reason "connection": the connection the run waits for.
    waiting_connection_id: uuid.UUID | None = None
    # A park with nothing of a turn in flight: the run waits on no release (Park.between_turns).
    between_turns: bool = False


@dataclass(frozen=True)
class Usage:
    """Tokens and cost of one commit (or, summed, of a run): what the commit statement adds
    to the run's counters. Priced by the credits domain (control_plane/credits/pricing.py);
    the store only carries it."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    cost_micros: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cached_tokens + other.cached_tokens,
            self.reasoning_tokens + other.reasoning_tokens,
            self.cost_micros + other.cost_micros,
        )


@dataclass(frozen=True)
class CommitRequest:
    workspace_id: str
    run_id: uuid.UUID
    epoch: int
    steps: list[NewStep]
    transition: Transition = field(default_factory=Transition)
    model_calls: int = 0
    tool_calls: int = 0
    tokens: int = 0
    # Tokens and cost of the steps, priced from the table (control_plane/credits/pricing.py).
    usage: Usage = field(default_factory=Usage)
    # Renew the lease on every commit that keeps it (an executor that counts every commit
    # as a renewal); False: only once half of it or less is left (sql/lease.sql says why).
    renew_always: bool = True
    # Calls an argument constraint refused in these steps (issue 48), added to the run's
    # refused_calls in the same statement.
    refused_calls: int = 0


@dataclass(frozen=True)
class CommitResult:
    status: str
    wake_at: datetime | None
    duplicate: bool = False
    # Why the run stopped at this commit although it asked to go on (out of credits).
    stopped: str | None = None
    # This commit renewed the lease, to wake_at (a duplicate says False: it cannot tell).
    renewed: bool = False
    # The run has spent all it reserved (a metered run: control_plane/credits/top_up.py).
    credits_due: bool = False
    # The run's refused and started tool calls after this commit (issue 48: a run that
    # finishes with refusals is counted; 0 for a duplicate).
    refused_calls: int = 0
    tool_calls: int = 0


async def commit(
    pool: asyncpg.pool.Pool | asyncpg.Connection,
    req: CommitRequest,
    lease_seconds: float,
    now: datetime | None = None,
    via: Lane | None = None,
) -> CommitResult:
    """Append steps and apply the transition if the run is still held at req.epoch.

    Raises Fenced when it is not. A retry of a commit that already landed
    (same epoch, same seqs and kinds) is acknowledged as a duplicate. `via`: a connection
    the caller holds for its commits, for the statement itself (the rest uses `pool`).
    """
    t, bound = req.transition, _bound(req, lease_seconds, now)
    # One statement is its own transaction: no BEGIN/COMMIT round trips on the hottest
    # path. An explicit one exists for the caller's savepoint and for the fault point
    # that fails inside the transaction.
    explicit = in_transaction(pool) or faults.active()
    row = None
    try:
        async with transaction(pool) if explicit else _Alone(via or pool) as db:
            # The common case: a step appended, the lease kept as it is. No row: fenced,
            # or the renewal is due, which run_commit tells apart (renewing, or fenced).
            if t.status is None and not req.renew_always:
                row = await run(db, "run_commit_keep", **bound)
            if row is None:
                row = await run(
                    db,
                    "run_commit",
                    **bound,
                    status=t.status,
                    wait_reason=t.wait_reason,
                    wake_at=t.wake_at,
                    wake_after_seconds=t.wake_after_seconds,
                    text=t.text,
                    waiting_connection_id=t.waiting_connection_id,
                    renew_always=req.renew_always,
                    between_turns=t.between_turns,
                )
            if explicit:
                faults.point("control_plane.commit.in_transaction")
    except asyncpg.UniqueViolationError:
        row = None
    return await _settle(pool, req, row)


class _Alone:
    """`async with` over a pool or connection as it is: the statement is its own
    transaction."""

    def __init__(self, db: asyncpg.pool.Pool | asyncpg.Connection | Lane) -> None:
        self.db = db

    async def __aenter__(self) -> asyncpg.pool.Pool | asyncpg.Connection | Lane:
        return self.db

    async def __aexit__(self, *exc: object) -> None:
        return None


async def _settle(
    pool: asyncpg.pool.Pool | asyncpg.Connection, req: CommitRequest, row: asyncpg.Record | None
) -> CommitResult:
    """The outcome of a commit whose statement returned `row` (None: nothing landed)."""
    if row is not None:
        return CommitResult(
            row["status"],
            row["wake_at"],
            renewed=row["renewed"],
            credits_due=row["credits_due"],
            refused_calls=row["refused_calls"],
            tool_calls=row["tool_calls"],
        )
    if req.steps and await _already_committed(pool, req):
        return CommitResult(req.transition.status or "running", None, duplicate=True)
    raise Fenced(f"run {req.run_id} is not held at epoch {req.epoch}")


async def commit_many(
    pool: asyncpg.pool.Pool,
    reqs: list[CommitRequest],
    lease_seconds: float,
    via: Lane | None = None,
) -> list[CommitResult | BaseException]:
    """Commit several runs' requests (each run at most once, all of one workspace: the
    statement names it, so a Citus coordinator routes it to one shard) in one statement;
    each entry is that request's result or the error `commit` would have raised for it
    alone.

    Fenced per run: a run no longer held is left out and settled alone (a retried
    duplicate is recognised, else Fenced) while the others land. If the statement
    fails (a retried commit's seqs already there, a payload the database refuses), it
    wrote nothing, and each request is committed alone so only its own error is its own.
    `via` as commit's.
    """
    if len({r.workspace_id for r in reqs}) > 1:
        raise ValueError("commit_many takes the commits of one workspace")
    try:
        if faults.active():
            async with transaction(pool) as conn:
                rows = await _apply_many(conn, reqs, lease_seconds)
                faults.point("control_plane.commit.in_transaction")
        else:
            rows = await _apply_many(via or pool, reqs, lease_seconds)
    except Exception as exc:  # noqa: BLE001 - each request's own error is found alone
        if transient(exc):  # the database is unreachable: each is told so, as alone
            return [exc for _ in reqs]
        return await asyncio.gather(
            *(commit(pool, r, lease_seconds) for r in reqs), return_exceptions=True
        )
    by_index = {row["i"]: row for row in rows}
    return await asyncio.gather(
        *(_settle(pool, r, by_index.get(i)) for i, r in enumerate(reqs, start=1)),
        return_exceptions=True,
    )


def _bound(req: CommitRequest, lease_seconds: float, now: datetime | None) -> dict[str, Any]:
    """What both commit statements bind: the fence, the steps and the counters."""
    return {
        "workspace_id": req.workspace_id,
        "run_id": req.run_id,
        "epoch": req.epoch,
        "seqs": [s.seq for s in req.steps],
        "kinds": [s.kind for s in req.steps],
        "ref_seqs": [s.ref_seq for s in req.steps],
        "payloads": [s.payload_json for s in req.steps],
        "model_calls": req.model_calls,
        "tool_calls": req.tool_calls,
        "refused_calls": req.refused_calls,
        "tokens": req.tokens,
        "input_tokens": req.usage.input_tokens,
        "output_tokens": req.usage.output_tokens,
        "cached_tokens": req.usage.cached_tokens,
        "reasoning_tokens": req.usage.reasoning_tokens,
        "cost_micros": req.usage.cost_micros,
        "lease_seconds": lease_seconds,
        "now": now,
    }


async def _apply_many(
    db: asyncpg.pool.Pool | asyncpg.Connection | Lane,
    reqs: list[CommitRequest],
    lease_seconds: float,
) -> list[asyncpg.Record]:
    ts, us = [r.transition for r in reqs], [r.usage for r in reqs]
    steps = [(i, s) for i, r in enumerate(reqs, start=1) for s in r.steps]
    return await run(
        db,
        "run_commit_many",
        workspace_id=reqs[0].workspace_id,
        run_ids=[r.run_id for r in reqs],
        epochs=[r.epoch for r in reqs],
        model_calls=[r.model_calls for r in reqs],
        tool_calls=[r.tool_calls for r in reqs],
        tokens=[r.tokens for r in reqs],
        input_tokens=[u.input_tokens for u in us],
        output_tokens=[u.output_tokens for u in us],
        cached_tokens=[u.cached_tokens for u in us],
        reasoning_tokens=[u.reasoning_tokens for u in us],
        cost_micros=[u.cost_micros for u in us],
        statuses=[t.status for t in ts],
        wait_reasons=[t.wait_reason for t in ts],
        wake_ats=[t.wake_at for t in ts],
        wake_after_seconds=[t.wake_after_seconds for t in ts],
        texts=[t.text for t in ts],
        waiting_connection_ids=[t.waiting_connection_id for t in ts],
        renew_always=[r.renew_always for r in reqs],
        between_turns=[t.between_turns for t in ts],
        refused_calls=[r.refused_calls for r in reqs],
        step_counts=[len(r.steps) for r in reqs],
        step_runs=[i for i, _ in steps],
        seqs=[s.seq for _, s in steps],
        kinds=[s.kind for _, s in steps],
        ref_seqs=[s.ref_seq for _, s in steps],
        payloads=[s.payload_json for _, s in steps],
        lease_seconds=lease_seconds,
    )


async def _already_committed(
    pool: asyncpg.pool.Pool | asyncpg.Connection, req: CommitRequest
) -> bool:
    rows = await run(
        pool, "steps_by_seqs", req.workspace_id, req.run_id, [s.seq for s in req.steps]
    )
    found = {r["seq"]: (r["epoch"], r["kind"]) for r in rows}
    wanted = {s.seq: (req.epoch, s.kind) for s in req.steps}
    if found == wanted:
        return True
    if found:
        # Some seqs are taken by another epoch's steps: this writer lost the run.
        raise CommitConflict(f"seqs {sorted(found)} of run {req.run_id} are taken")
    return False


async def list_steps(
    pool: asyncpg.pool.Pool, workspace_id: str, run_id: uuid.UUID, from_seq: int, limit: int
) -> list[Step]:
    rows = await run(pool, "steps_list", workspace_id, run_id, from_seq, limit)
    return Step.of_rows(rows)


async def seen_values(
    db: Any, workspace_id: str, tool: str, argument: str, limit: int
) -> list[str]:
    """Values `argument` took in the workspace's earlier ok calls of `tool` (issue 48)."""
    rows = await run(db, "steps_seen_values", workspace_id, tool, argument, limit)
    return [r["value"] for r in rows]


async def steps_for_runs(
    pool: asyncpg.pool.Pool, keys: list[tuple[str, uuid.UUID]]
) -> dict[uuid.UUID, list[Step]]:
    """Whole step logs of several runs, grouped by run id."""
    if not keys:
        return {}
    rows = await run(pool, "steps_for_runs", [k[0] for k in keys], [k[1] for k in keys])
    grouped: dict[uuid.UUID, list[Step]] = {k[1]: [] for k in keys}
    # The rows come ordered by run: one group lookup a run, not one a step.
    run_id: uuid.UUID | None = None
    group: list[Step] = []
    for step in Step.of_rows(rows):
        if step.run_id != run_id:
            run_id = step.run_id
            group = grouped[run_id]
        group.append(step)
    return grouped
