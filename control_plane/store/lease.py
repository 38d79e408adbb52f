"""Claims, heartbeats and lease hand-back: the run row as a lease.

The claim is fair across workspaces and holds every concurrency cap with any
number of claimers: sql/schema.sql section 7 explains its parts (turns taken in
workspace_turns, a lease step per shard, the turns marked and raised) and why,
and migrations/0047_claim_per_shard.sql runs them in one call.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from control_plane.store.db import transaction
from control_plane.store.queries import run
from control_plane.store.runs import Run


@dataclass(frozen=True)
class Release:
    """The release claiming owners run: their own, those it continues, and how recently
    an executor must have been seen for its release to count as connected."""

    name: str
    continues: tuple[str, ...] = ()
    live_seconds: float = 30.0
    # Only releases promoted or past a canary take new runs (AGENTRUN_RELEASE_GATE=canary).
    gated: bool = False

    def params(self) -> tuple[list[str], str, float, bool]:
        return [self.name, *self.continues], self.name, self.live_seconds, self.gated


class Claimed(list[Run]):
    """The runs a claim leased; `others_due`: it took fewer than it had owners while a
    workspace whose turn it would have taken was held by another claimer and still has
    due runs with room: claiming again soon may find them (migrations/0031_claim_others_due.sql)."""

    others_due: bool = False
    # The workspaces among the runs' that have a credit account (credits.claims).
    metered: frozenset[str] = frozenset()


@dataclass(frozen=True)
class LeaseKey:
    workspace_id: str
    run_id: uuid.UUID
    epoch: int


async def claim_due(
    pool: asyncpg.pool.Pool | asyncpg.Connection,
    owners: list[str],
    lease_seconds: float,
    now: datetime | None = None,
    scope: Sequence[str] | None = None,
    carried: Sequence[str] | None = None,
    on_takeover: Callable[[Run], None] | None = None,
    release: Release | None = None,
) -> Claimed:
    """Claim up to len(owners) due runs, fairly; run i is leased to owners[i].

    Lapsed leases first, then the oldest due runs of the workspaces served
    least recently, round robin, never over a workspace's or an agent's cap.
    Only runs of the workspaces in `scope` (None: all) are claimed: the owners'
    executor credentials serve no others. With `carried` (the tools the owners
    carry; None: any), only runs whose agent version needs no other tool.
    `on_takeover` is told of each run claimed because its lease had lapsed.
    With `release` (None: releases ignored), only runs on the owners' releases,
    and runs on none only if theirs is the newest (sql/lease.sql).
    """
    if not owners:
        return Claimed()
    allowed = list(scope) if scope is not None else None
    tools = json.dumps(list(carried)) if carried is not None else None
    routing = release.params() if release else (None, None, 0.0, False)
    # One statement, one round trip: agentrun_claim() takes the turns, runs the lease step
    # on each shard holding one, marks the turns and raises next_wake_at in its own
    # transaction (sql/lease.sql run_claim). In a caller's
    # transaction, a savepoint, as store.db.transaction makes.
    args = (owners, lease_seconds, now, allowed, tools, *routing)
    if isinstance(pool, asyncpg.Connection):
        async with transaction(pool) as conn:
            rows = await run(conn, "run_claim", *args)
    else:
        rows = await run(pool, "run_claim", *args)
    # A last row with its run NULL says others are due (0031); the rest are the runs.
    others_due = bool(rows) and rows[-1]["others_due"]
    if others_due:
        rows = rows[:-1]
    claimed = Claimed(Run.from_records(rows))
    claimed.others_due = others_due
    claimed.metered = frozenset(r["workspace_id"] for r in rows if r["metered"])
    if on_takeover is not None:
        for row, claimed_run in zip(rows, claimed, strict=True):
            if row["taken_over"]:
                on_takeover(claimed_run)
    return claimed


@dataclass(frozen=True)
class QueuePosition:
    """Where a run waiting for its turn stands, and what it waits for."""

    due: bool
    runs_ahead: int
    workspace_running: int
    workspace_max_concurrency: int
    agent_running: int
    agent_max_concurrency: int | None

    @property
    def workspace_full(self) -> bool:
        return self.workspace_running >= self.workspace_max_concurrency

    @property
    def agent_full(self) -> bool:
        cap = self.agent_max_concurrency
        return cap is not None and self.agent_running >= cap


async def queue_position(
    pool: asyncpg.pool.Pool, workspace_id: str, run_id: uuid.UUID, now: datetime | None = None
) -> QueuePosition | None:
    """The run's place in its workspace's queue; None unless it is queued or waiting on a time."""
    row = await run(pool, "run_queue_position", workspace_id, run_id, now)
    return QueuePosition(**dict(row)) if row is not None else None


def _by_workspace(
    leases: Sequence[LeaseKey],
) -> list[tuple[str, list[uuid.UUID], list[int]]]:
    """The leases as (workspace, its run ids, their epochs), one entry per workspace in
    order: the statements over several leases name one workspace each, so that a Citus
    coordinator routes each to one shard (a lock across shards is refused)."""
    grouped: dict[str, tuple[list[uuid.UUID], list[int]]] = {}
    for lease in leases:
        ids, epochs = grouped.setdefault(lease.workspace_id, ([], []))
        ids.append(lease.run_id)
        epochs.append(lease.epoch)
    return [(workspace_id, ids, epochs) for workspace_id, (ids, epochs) in grouped.items()]


def _keys(rows: Sequence[asyncpg.Record]) -> list[LeaseKey]:
    return [LeaseKey(r["workspace_id"], r["run_id"], r["lease_epoch"]) for r in rows]


@dataclass(frozen=True)
class HeartbeatOutcome:
    renewed: dict[LeaseKey, datetime]
    # Refused and failed: active time reached the deadline, or max age passed.
    past_deadline: set[LeaseKey]
    past_max_age: set[LeaseKey] = field(default_factory=set)
    # Renewed, and paused (PauseRun): the holder is asked to hand the run back.
    paused: set[LeaseKey] = field(default_factory=set)


@dataclass(frozen=True)
class Beat:
    """A heartbeat's outcome by position (from 0) in the leases it was given: what an
    executor's beat needs answered for each of the thousands of runs it may hold, without
    a key object per lease."""

    renewed: dict[int, datetime]
    past_deadline: set[int]
    past_max_age: set[int]
    paused: set[int]


async def heartbeat_positions(
    pool: asyncpg.pool.Pool,
    owner: str,
    workspace_ids: Sequence[str],
    run_ids: Sequence[uuid.UUID],
    epochs: Sequence[int],
    lease_seconds: float,
    now: datetime | None = None,
) -> Beat:
    """heartbeat() over the leases given as three parallel lists, the answer by position.
    A statement per workspace the leases are in (one, nearly always), each its own
    transaction (each lease is renewed or not on its own row, so nothing needs them
    together); its rows name the renewed leases by position, so the leases renewed, the
    common case, cost no key object, hash or lookup here."""
    positions: dict[str, list[int]] = {}
    for i, workspace_id in enumerate(workspace_ids):
        positions.setdefault(workspace_id, []).append(i)
    renewed: dict[int, datetime] = {}
    paused: set[int] = set()
    for workspace_id, at in positions.items():
        whole = len(at) == len(run_ids)
        rows = await run(
            pool,
            "run_heartbeat",
            owner,
            workspace_id,
            run_ids if whole else [run_ids[i] for i in at],
            epochs if whole else [epochs[i] for i in at],
            lease_seconds,
            now,
        )
        for r in rows:
            i = at[r["i"] - 1]
            renewed[i] = r["wake_at"]
            if r["paused"]:
                paused.add(i)
    past_deadline: set[int] = set()
    past_max_age: set[int] = set()
    if len(renewed) < len(run_ids):
        refused = {
            LeaseKey(workspace_ids[i], run_ids[i], epochs[i]): i
            for i in range(len(run_ids))
            if i not in renewed
        }
        for workspace_id, ids, eps in _by_workspace(list(refused)):
            for r in await _retry_seq_race(
                pool, "run_fail_past_deadline", workspace_id, ids, eps, now
            ):
                i = refused[LeaseKey(r["workspace_id"], r["run_id"], r["lease_epoch"])]
                if r["error"] == "deadline exceeded":
                    past_deadline.add(i)
                elif r["error"] == "max age exceeded":
                    past_max_age.add(i)
    return Beat(renewed, past_deadline, past_max_age, paused)


async def heartbeat(
    pool: asyncpg.pool.Pool,
    owner: str,
    leases: list[LeaseKey],
    lease_seconds: float,
    now: datetime | None = None,
) -> HeartbeatOutcome:
    """Renew the leases still held within the run's limits; fail those past a limit
    (heartbeat_positions, answered by lease)."""
    if not leases:
        return HeartbeatOutcome({}, set())
    beat = await heartbeat_positions(
        pool,
        owner,
        [k.workspace_id for k in leases],
        [k.run_id for k in leases],
        [k.epoch for k in leases],
        lease_seconds,
        now,
    )
    return HeartbeatOutcome(
        {leases[i]: wake_at for i, wake_at in beat.renewed.items()},
        {leases[i] for i in beat.past_deadline},
        {leases[i] for i in beat.past_max_age},
        {leases[i] for i in beat.paused},
    )


async def _retry_seq_race(pool: asyncpg.pool.Pool, query: str, *args: object) -> Any:
    """Run a statement that appends a finish step at the next seq, again if a concurrent
    writer took that seq first (its snapshot did not see the other step)."""
    for _ in range(5):
        try:
            return await run(pool, query, *args)
        except asyncpg.UniqueViolationError:
            continue
    return []


async def fail_held(pool: asyncpg.pool.Pool, lease: LeaseKey, reason: str) -> bool:
    """Fail a run still held at lease.epoch with `reason` (and its finish step); False if
    it is not held at that epoch."""
    rows = await _retry_seq_race(
        pool, "run_fail_held", lease.workspace_id, lease.run_id, lease.epoch, reason
    )
    return rows is not None and rows != []


async def fail_past_max_age(
    pool: asyncpg.pool.Pool, batch: int, now: datetime | None = None
) -> list[LeaseKey]:
    """Fail up to `batch` runs past their max age that no executor holds; the lease each
    had when it failed. Two steps, as every sweeper: an unlocked read of the workspaces
    that have such runs (every shard on Citus), then a locking statement per workspace
    (one shard), each its own transaction."""
    failed: list[LeaseKey] = []
    for row in await run(pool, "runs_past_max_age_workspaces", batch, now):
        if len(failed) >= batch:
            break
        failed += _keys(
            await _retry_seq_race(
                pool, "run_fail_past_max_age", batch - len(failed), now, row["workspace_id"]
            )
        )
    return failed


async def release_unassigned(
    pool: asyncpg.pool.Pool, lease: LeaseKey, now: datetime | None = None
) -> None:
    """Make a claimed-but-undelivered run runnable again now."""
    await run(pool, "run_release_unassigned", lease.workspace_id, lease.run_id, lease.epoch, now)


async def release_on_break(
    pool: asyncpg.pool.Pool,
    owner: str,
    leases: list[LeaseKey],
    after_seconds: float,
    now: datetime | None = None,
) -> list[LeaseKey]:
    """Let these runs, still held by `owner` at these epochs, be taken over `after_seconds`
    from now (sooner if their lease lapses sooner): its stream ended. The ones moved."""
    moved: list[LeaseKey] = []
    for workspace_id, ids, epochs in _by_workspace(leases):
        moved += _keys(
            await run(
                pool, "run_release_on_break", owner, workspace_id, ids, epochs, after_seconds, now
            )
        )
    return moved
