"""The contract canary's outcomes on a release and its self-check's claim (sql/canary.sql)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from control_plane.store.db import Connection, Pool
from control_plane.store.queries import run


@dataclass(frozen=True)
class Failure:
    """A release's last canary failed (after its last pass): when, where and why."""

    at: datetime
    stage: str
    reason: str

    @classmethod
    def parse(cls, at: datetime, text: str) -> Failure:
        """From the column's "stage: reason" (release names, in stages, hold no ':')."""
        stage, _, reason = text.partition(": ")
        return cls(at, stage, reason)


@dataclass(frozen=True)
class Check:
    """Whether this replica runs a release's self-check now; if not, for how many seconds
    another replica still holds it (None: nobody does, and none is needed)."""

    taken: bool
    held_for: float | None = None


async def take_check(
    pool: Pool, release: str, seconds: float, executor_id: str, now: datetime | None = None
) -> Check:
    """Take `release`'s self-check (for `seconds` at most), if it needs one and is free."""
    row = await run(pool, "release_canary_check_take", release, seconds, executor_id, now)
    return Check(row["taken"], None if row["taken"] else row["held_for"])


async def check_done(pool: Pool, release: str, executor_id: str) -> None:
    await run(pool, "release_canary_check_done", release, executor_id)


async def failed(pool: Pool, release: str, stage: str, reason: str) -> None:
    await run(pool, "release_canary_failed", release, f"{stage}: {reason}")


async def pin(conn: Connection, workspace_id: str, run_id: uuid.UUID, release: str) -> None:
    """Put a canary turn just admitted (in the caller's transaction) on `release`."""
    await run(conn, "run_pin_release", workspace_id, run_id, release)
