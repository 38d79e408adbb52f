"""The scheduler loop: fires due schedule slots as trigger events, once each, on any number of replicas.

Each schedule trigger stores its next slot and when it fires (the slot plus
its deterministic jitter, control_plane/triggers/schedule.py). Every replica
runs this loop. A round takes due schedules with `FOR UPDATE SKIP LOCKED` in
one transaction, so two replicas never take the same trigger at once; for
each it records the slot's event with its run (dedupe key
`agent_id:scheduled_for`) and moves the trigger to its next slot, and commits
both together. A replica that dies mid-round commits nothing and the slot is
still due; a slot that somehow fired twice would hit the dedupe constraint
and start no second run.

Each slot goes through the schedule's overlap policy
(control_plane/triggers/overlap.py). Under buffer_one a slot may wait in the
schedule's one-slot buffer: every round first takes, the same way (SKIP
LOCKED), the enabled schedules with a buffered slot and no run still going,
and fires those slots. A paused (disabled) schedule is in neither pass, so it
fires nothing, buffered or due.

The catch-up window is the schedule's own when it has one, else the server's.

Runs are admitted `queued`; a workspace above its concurrency cap simply has
them wait there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from control_plane.ground.config import RunDefaults
from control_plane.ops import metrics
from control_plane.store import schedules as schedule_store
from control_plane.store import triggers as store
from control_plane.triggers import flow, overlap
from control_plane.triggers import schedule as schedules
from control_plane.triggers.deliveries import Settings

log = logging.getLogger(__name__)

RETRY_FAILED_SLOT = timedelta(seconds=60)


class Scheduler:
    """Fires due slots; `run()` is the control-plane loop, `tick()` one pass (tests drive it)."""

    def __init__(
        self,
        pool: store.Pool,
        defaults: RunDefaults,
        on_runnable: Callable[[], None],
        *,
        poll_seconds: float = 1.0,
        batch: int = 100,
        catchup_seconds: float = 600.0,
        on_cancel: Callable[[str, uuid.UUID], None] | None = None,
    ) -> None:
        self._pool = pool
        self._defaults = defaults
        self._on_runnable = on_runnable
        self._on_cancel = on_cancel
        self._poll = poll_seconds
        self._batch = batch
        self._catchup = catchup_seconds

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception as exc:  # noqa: BLE001 - the database may be restarting
                log.warning("scheduler round failed, retrying: %s", exc)
            await asyncio.sleep(self._poll)

    async def tick(self, now: datetime | None = None) -> int:
        """Fire every buffered slot that may go and every slot due at `now` (database clock
        when None); returns how many it handled (fired, recorded as skipped or buffered by
        the overlap policy, or skipped as older than the catch-up window)."""
        fired = 0
        while count := await self.release_buffers(now):
            fired += count
        # A fired slot may be followed by another one already due (catching up): go on
        # until a round finds nothing (or only schedules another replica holds).
        while count := await self.fire_batch(now):
            fired += count
        # Debounced and batched triggers' due groups (control_plane/triggers/flow.py).
        while count := await flow.flush_due(
            self._pool, self._defaults, self._on_runnable, now, self._batch
        ):
            fired += count
        return fired

    async def release_buffers(self, now: datetime | None = None) -> int:
        """One transaction: fire the buffered slots of up to `batch` schedules that no longer
        have a run going (buffer_one)."""
        released = 0
        for workspace_id in await schedule_store.buffered_workspaces(self._pool, self._batch):
            if released >= self._batch:
                break
            released += await self._release_workspace(workspace_id, self._batch - released, now)
        return released

    async def _release_workspace(self, workspace_id: str, limit: int, now: datetime | None) -> int:
        """One workspace's transaction of release_buffers (on Citus: one shard)."""
        firing = overlap.Firing(self._defaults, now)
        released = 0
        async with store.transaction(self._pool) as conn:
            for row in await schedule_store.claim_buffered(conn, workspace_id, limit, now):
                try:
                    async with store.transaction(conn):  # a savepoint: one cannot stop the rest
                        await overlap.release(conn, row, firing)
                    released += 1
                except Exception as exc:  # noqa: BLE001 - logged; the slot stays buffered
                    log.error(
                        "schedule %s/%s could not fire its buffered slot: %s",
                        row["workspace_id"],
                        row["trigger_id"],
                        exc,
                    )
        firing.committed(self._on_runnable, self._on_cancel)
        return released

    async def fire_batch(self, now: datetime | None = None) -> int:
        """Lock up to `batch` due schedules, fire each one's slot, advance: a transaction
        per workspace, the longest overdue first (on Citus each stays on one shard)."""
        fired = 0
        for workspace_id in await store.due_schedule_workspaces(self._pool, self._batch, now):
            if fired >= self._batch:
                break
            firing = overlap.Firing(self._defaults, now)
            async with store.transaction(self._pool) as conn:
                rows = await store.claim_due_schedules(conn, workspace_id, self._batch - fired, now)
                for row in rows:
                    await self._fire_isolated(conn, row, firing)
            firing.committed(self._on_runnable, self._on_cancel)
            fired += len(rows)
        return fired

    async def _fire_isolated(
        self, conn: store.Connection, row: Any, firing: overlap.Firing
    ) -> None:
        """Fire one slot inside a savepoint, so one bad trigger cannot stop the others."""
        started, cancelled = firing.started, len(firing.cancelled)
        try:
            async with store.transaction(conn):
                await self._fire(conn, row, firing)
        except Exception as exc:  # noqa: BLE001 - logged, retried later
            firing.started, firing.cancelled[cancelled:] = started, []  # rolled back
            log.error(
                "schedule %s/%s could not fire slot %s: %s",
                row["workspace_id"],
                row["trigger_id"],
                row["next_slot_at"].isoformat(),
                exc,
            )
            retry_at = row["db_now"] + RETRY_FAILED_SLOT
            with contextlib.suppress(Exception):
                await store.postpone_schedule(
                    conn, row["workspace_id"], row["trigger_id"], row["next_slot_at"], retry_at
                )

    async def _fire(self, conn: store.Connection, row: Any, firing: overlap.Firing) -> None:
        """Fire the due slot under the schedule's overlap policy (unless the slot is older than
        its catch-up window), then advance."""
        settings = Settings.of(row)
        sched = schedules.Schedule.from_json(dict(settings.config))
        slot: datetime = row["next_slot_at"]
        catchup = sched.catchup(self._catchup)
        if row["db_now"] - slot > timedelta(seconds=catchup):
            # Missed while no replica ran: skipped, not burst.
            log.info(
                "schedule %s/%s skipped slot %s, older than the catch-up window",
                settings.workspace_id,
                settings.trigger_id,
                slot.isoformat(),
            )
        else:
            lag = (row["db_now"] - row["next_fire_at"]).total_seconds()
            metrics.SCHEDULE_LAG.observe(max(0.0, lag))
            key = schedules.dedupe_key(settings.agent_id, slot)
            due = overlap.Slot(slot, key, fire_at=row["next_fire_at"])
            await overlap.fire(conn, row, due, sched.overlap, firing)
        nxt = sched.following_slot(slot, row["db_now"], catchup)
        fire_at = sched.fire_time(nxt, settings.workspace_id, settings.trigger_id)
        await store.advance_schedule(
            conn, settings.workspace_id, settings.trigger_id, slot, nxt, fire_at
        )
