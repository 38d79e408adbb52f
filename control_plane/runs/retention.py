"""The retention loop: deletes each workspace's finished runs once its retention period is over.

A workspace's `retention_days` (0, the default: keep forever; set through
WorkspaceAdminService.SetWorkspaceRetention) says how long its completed, failed and
cancelled runs are kept after they finished. Every replica runs this loop; a round
goes through the workspaces with a period and deletes their runs finished before the
cutoff, in short statements (each its own transaction) until one deletes none: at most
`batch` runs and about `steps` step rows a statement, and after each a rest nine times as
long as the statement took (`duty` 0.1: the deleter is at work at most a tenth of the
time), or longer where that would delete more than `steps_per_second` step rows a second
(25,000). The runs of a statement are locked FOR UPDATE SKIP LOCKED, so neither of two replicas waits on the
other (the one that finds the oldest runs held ends its round and leaves them to the
other); claims, heartbeats and commits lock only unfinished runs, which are never
chosen, so the deleter never blocks them.
Export a run first if you need it (`agentrun runs export RUN`).

The contract canary's internal workspace keeps its finished runs only for CANARY_KEEP (an
hour) whatever its period says: a deploy pipeline runs a canary per step, and their runs
are nobody's history.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime

from control_plane.deploys.canary import CANARY_KEEP, CANARY_WORKSPACE
from control_plane.store import retention as store

log = logging.getLogger(__name__)

# Why a statement is bounded by step rows, commits asynchronously and rests after itself.
# The deleter's CPU is small (~2 us a step row in its backend); what claims feel is its
# I/O: ~70 bytes of WAL a step row and the pages it dirties, on the disk their commits
# fsync to. A statement's work and WAL grow with the step rows it deletes, and runs hold
# from a few to thousands of steps (500 runs a statement was 25k rows at 50 steps a run,
# 500k at 1,000), so a statement takes at most ~10,000 step rows (~700 KB of WAL). Its
# commit does not wait for the flush (store/sql/retention.sql says why that is safe): one
# fsync per small statement, competing with the claims' own, measured slower for the
# deleter and no better for claims; the WAL writer flushes it in the background. Resting
# nine times as long as the statement took bounds the deleter to a tenth of the time and
# its WAL rate to a tenth of what it could reach, and slows it by itself when the
# database is busy: statements take longer, and so do the rests. `bench retention`, four
# alternations on a quiet machine: the claim's p99 while it deletes 5.3-6.5 ms at 0.25
# against 7.1-10.9 ms at 0.5, for 47-70k steps deleted a second (100-124k at 0.5); on a
# faster day (2026-12-02), 3.0-3.6 ms at 0.1 against 4.5-5.2 at 0.25 (p99 without the
# deleter 1.9-2.4 ms), for 38-47k steps a second against 95-117k. Smaller statements
# (2,500 step rows) were no better at 0.25 (5.2-5.7 ms). 38k a second is still more than
# ten times what docs/scaling.md's load writes (3,300 step rows a second), and each
# replica runs a deleter.
#
# The duty cycle bounds the deleter's time, not its WAL, and the claims that commit while
# a statement runs flush the WAL it has written so far with their own. Where runs hold
# many steps, a statement spends its time on step rows alone (10 runs of 1,000 steps: 15
# ms, 540 KB of WAL) and a tenth of the time was 50-72k step rows a second, twice the
# rate with 50 steps a run (200 runs a statement, whose own rows and foreign-key checks
# take part of its time): the claim's p99 while it deleted was 1.5-1.9x that without it
# at 1,000 steps a run, 1.0-1.4x at 50. So the deleter also rests until it has deleted no
# more than STEPS_PER_SECOND step rows a second since the statement began. `bench
# retention` (2026-12-05, alternated on one server, 300k steps each): at a tenth of the
# time, 1,000 steps a run, p99 1.50x and 1.63x for 68-72k steps a second; at half the
# duty (the same rate as the cap below gives), 1.19x and 1.32x for 33k. At 50 steps a run
# the cap barely binds (31-34k a second). 25,000 a second is still over seven times the
# load above, per replica.
STEPS = 10_000
DUTY = 0.1
STEPS_PER_SECOND = 25_000


class Retention:
    """`run()` is the control-plane loop, `tick()` one round (tests drive it with a clock)."""

    def __init__(
        self,
        pool: store.Pool,
        *,
        poll_seconds: float = 60.0,
        batch: int = 500,
        steps: int = STEPS,
        duty: float = DUTY,
        steps_per_second: float = STEPS_PER_SECOND,
    ) -> None:
        if not 0 < duty <= 1:
            raise ValueError(f"duty must be in (0, 1], not {duty}")
        if not steps_per_second > 0:
            raise ValueError(f"steps_per_second must be above 0, not {steps_per_second}")
        self._pool = pool
        self._poll = poll_seconds
        self._batch = batch
        self._steps = steps
        # The rest after a statement, per second it took: (1 - duty) / duty.
        self._rest = (1 - duty) / duty
        self._steps_per_second = steps_per_second

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception as exc:  # noqa: BLE001 - the database may be restarting
                log.warning("retention round failed, retrying: %s", exc)
            await asyncio.sleep(self._poll)

    async def tick(self, now: datetime | None = None) -> int:
        """Delete every run past its workspace's period at `now` (database clock when None);
        returns how many runs it deleted."""
        due = await store.due_workspaces(self._pool, now)
        # An hour needs no clock agreement to the second: this replica's clock will do.
        canary = (CANARY_WORKSPACE, (now or datetime.now(UTC)) - CANARY_KEEP)
        deleted = 0
        for workspace_id, cutoff in [*due, canary]:
            deleted += await self._delete(workspace_id, cutoff)
        return deleted

    async def _delete(self, workspace_id: str, cutoff: datetime) -> int:
        """Delete the workspace's runs finished before `cutoff`, a batch per statement."""
        deleted = 0
        while True:
            start = time.monotonic()
            gone = await store.delete_batch(
                self._pool, workspace_id, cutoff, self._batch, self._steps
            )
            took = time.monotonic() - start
            if not gone.runs:
                return deleted
            deleted += gone.runs
            # The longer of the duty cycle's rest and the one that keeps the step rows
            # deleted since the statement began within STEPS_PER_SECOND.
            rest = max(took * self._rest, gone.steps / self._steps_per_second - took)
            log.info(
                "retention deleted %d runs (%d steps) of workspace %s in %.3fs, resting %.3fs",
                gone.runs,
                gone.steps,
                workspace_id,
                took,
                rest,
            )
            if rest:
                await asyncio.sleep(rest)
