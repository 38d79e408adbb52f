"""Releases (migrations/0020_releases.sql, 0037_release_pins.sql): known releases, drains,
ramps, rollbacks and explicit moves.

A run is pinned to the release of the executor that holds it while a turn is in progress
(the claim, sql/lease.sql, records it; a park between turns clears it, sql/steps.sql);
these are the operator's side of it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from control_plane.store import identity
from control_plane.store.admission import Admission
from control_plane.store.db import Pool, transaction
from control_plane.store.queries import run
from control_plane.store.runs import Run


@dataclass(frozen=True)
class ReleaseState:
    """One release as ListReleases reports it."""

    release: str
    first_seen_at: datetime
    promoted_at: datetime | None
    draining_since: datetime | None
    drain_deadline: datetime | None
    canary_passed_at: datetime | None
    canary_failed_at: datetime | None
    canary_failure: str | None
    ramp_percent: int | None
    rolled_back_at: datetime | None
    executors: list[str]
    runs_held: int
    oldest_held_since: datetime | None
    runs_waiting: int
    runs_completed: int
    runs_failed: int
    now: datetime

    @property
    def drained(self) -> bool:
        """A drain is done when none of its executors is left, it holds no run and no run
        waits pinned to it (a turn handed back in progress waits for one of its executors:
        until one returns, or an operator moves it, the drain is not done)."""
        return (
            self.draining_since is not None
            and not self.executors
            and not self.runs_held
            and not self.runs_waiting
        )


@dataclass(frozen=True)
class DrainOrder:
    """What a draining release's executors are told: the seconds left to its deadline
    (None: each executor's own, the longest turn it holds) and whether it is forced;
    `waiting`: runs pinned to it that wait for one of its executors (a turn handed back
    in progress, a lapsed lease), which an executor of it serves before it drains."""

    seconds_left: float | None = None
    force: bool = False
    waiting: int = 0


@dataclass(frozen=True)
class ReleaseRun:
    workspace_id: str
    run_id: uuid.UUID
    status: str
    wait_reason: str | None


async def seen(pool: Pool, *names: str) -> None:
    """Executors of these releases are connected (again: nothing changes)."""
    if any(names):
        await run(pool, "release_seen", list(names))


async def declared(pool: Pool, release: str, writes: int = 1, reads_from: int = 1) -> None:
    """An executor of `release` connected (Hello), writing step-log version `writes` and
    reading from `reads_from`: the release is known, with those versions, in one statement."""
    if release:
        await run(pool, "release_declared", release, writes, reads_from)


async def list_releases(
    pool: Pool, live_seconds: float, release: str | None = None
) -> list[ReleaseState]:
    rows = await run(pool, "release_list", release, live_seconds)
    return [ReleaseState(**{**dict(r), "executors": list(r["executors"])}) for r in rows]


async def runs_of(pool: Pool, release: str, limit: int) -> list[ReleaseRun]:
    """The runs the release holds or that wait pinned to it, oldest first."""
    return [ReleaseRun(**dict(r)) for r in await run(pool, "release_runs", release, limit)]


async def drain(
    pool: Pool, release: str, deadline_seconds: float | None, force: bool = False
) -> bool:
    """Start (or re-time, or force) a drain; False when the release is unknown."""
    return await run(pool, "release_drain", release, deadline_seconds, force) is not None


async def promote(pool: Pool, release: str) -> bool:
    return await run(pool, "release_promote", release) is not None


async def ramp(pool: Pool, release: str, percent: int) -> bool:
    return await run(pool, "release_ramp", release, percent) is not None


async def rollback(pool: Pool, release: str, deadline_seconds: float | None) -> bool:
    return await run(pool, "release_rollback", release, deadline_seconds) is not None


async def draining(pool: Pool) -> dict[str, DrainOrder]:
    """The releases draining now, each with what its executors are told."""
    return {
        r["release"]: DrainOrder(r["seconds_left"], r["forced"], r["waiting"])
        for r in await run(pool, "releases_draining")
    }


async def canary_passed(pool: Pool, release: str) -> None:
    await run(pool, "release_canary_passed", release)


async def connected(pool: Pool, release: str, live_seconds: float) -> bool:
    row = await run(pool, "release_connected", release, live_seconds)
    return bool(row["connected"])


@dataclass(frozen=True)
class Move:
    workspace_id: str
    run_id: uuid.UUID
    to_release: str | None  # None: on no release (the newest takes it)
    actor: str
    request_id: str


class NotMovable(Exception):
    """The run is held or finished: only a run nobody holds moves."""


async def move(pool: Pool, m: Move) -> str | None:
    """Move a run nobody holds to another release, audited in the same transaction.

    The release it was on, or raises LookupError (no such run) / NotMovable."""
    async with transaction(pool) as conn:
        row = await run(conn, "run_lock_for_move", m.workspace_id, m.run_id)
        if row is None:
            raise LookupError(str(m.run_id))
        if row["status"] not in ("queued", "waiting"):
            raise NotMovable(row["status"])
        await run(conn, "run_move_release", m.workspace_id, m.run_id, m.to_release)
        await _audit(conn, m, row["release"])
    return row["release"]  # type: ignore[no-any-return]


async def move_many(
    pool: Pool, workspace_id: str, run_ids: list[uuid.UUID], to_release: str | None
) -> int:
    """Move each of the runs that nobody holds to `to_release`, in one transaction, unaudited
    (a bulk action audits itself once); how many moved (the others are held or finished)."""
    moved = 0
    async with transaction(pool) as conn:
        for run_id in run_ids:
            row = await run(conn, "run_lock_for_move", workspace_id, run_id)
            if row is None or row["status"] not in ("queued", "waiting"):
                continue
            await run(conn, "run_move_release", workspace_id, run_id, to_release)
            moved += 1
    return moved


async def _audit(conn: asyncpg.Connection, m: Move, was: str | None) -> None:
    event = identity.AuditEvent(
        workspace_id=m.workspace_id,
        actor=m.actor,
        action="run.move_release",
        object_kind="run",
        object_id=str(m.run_id),
        request_id=m.request_id,
        detail={"from_release": was, "to_release": m.to_release},
    )
    await identity.audit(conn, event)


async def admit_on(pool: Pool, adm: Admission, release: str | None) -> Run:
    """Admit a run already on `release` (None: on none yet), in one transaction."""
    async with transaction(pool) as conn:
        row = await run(conn, "run_insert", **adm.params(None))
        if release is not None:
            await run(conn, "run_pin_release", adm.workspace_id, adm.run_id, release)
    return Run.from_record(row)
