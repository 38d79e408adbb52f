"""The retention loop: deletes each workspace's finished runs once its retention period is over.

A workspace's `retention_days` (0, the default: keep forever; set through
WorkspaceAdminService.SetWorkspaceRetention) says how long its completed, failed and
cancelled runs are kept after they finished. Every replica runs this loop; a round
goes through the workspaces with a period and deletes their runs finished before the
cutoff, `batch` runs per statement (each its own short transaction), until a statement
deletes none. The runs of a batch are locked FOR UPDATE SKIP LOCKED, so two replicas
take different runs and neither waits on the other; claims, heartbeats and commits
lock only unfinished runs, which are never chosen, so the deleter never blocks them.
Export a run first if you need it (`agentrun runs export RUN`).

The contract canary's internal workspace keeps its finished runs only for CANARY_KEEP (an
hour) whatever its period says: a deploy pipeline runs a canary per step, and their runs
are nobody's history.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from control_plane.canary import CANARY_KEEP, CANARY_WORKSPACE
from control_plane.store import retention as store

log = logging.getLogger(__name__)


class Retention:
    """`run()` is the control-plane loop, `tick()` one round (tests drive it with a clock)."""

    def __init__(
        self, pool: store.Pool, *, poll_seconds: float = 60.0, batch: int = 500,
        pause_seconds: float = 0.1,
    ) -> None:  # fmt: skip
        self._pool = pool
        self._poll = poll_seconds
        self._batch = batch
        # A breath between batches, so a large backlog yields the CPU to claims and commits
        # (bench retention: claim p99 doubled on 2 cores without it).
        self._pause = pause_seconds

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
        while (gone := await store.delete_batch(
            self._pool, workspace_id, cutoff, self._batch
        )).runs:  # fmt: skip
            deleted += gone.runs
            log.info("retention deleted %d runs (%d steps) of workspace %s",
                     gone.runs, gone.steps, workspace_id)  # fmt: skip
            if self._pause:
                await asyncio.sleep(self._pause)
        return deleted
