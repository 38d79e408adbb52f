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

Runs are admitted `queued`; a workspace above its concurrency cap simply has
them wait there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from control_plane import metrics
from control_plane.config import RunDefaults
from control_plane.store import triggers as store
from control_plane.triggers import admission
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
    ) -> None:
        self._pool = pool
        self._defaults = defaults
        self._on_runnable = on_runnable
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
        """Fire every slot due at `now` (database clock when None); returns how many slots
        it handled (fired, or skipped as older than the catch-up window)."""
        fired = 0
        # A fired slot may be followed by another one already due (catching up): go on
        # until a round finds nothing (or only schedules another replica holds).
        while count := await self.fire_batch(now):
            fired += count
        return fired

    async def fire_batch(self, now: datetime | None = None) -> int:
        """One transaction: lock up to `batch` due schedules, fire each one's slot, advance."""
        started = 0
        async with store.transaction(self._pool) as conn:
            rows = await store.claim_due_schedules(conn, self._batch, now)
            for row in rows:
                started += await self._fire_isolated(conn, row, now)
        if started:
            self._on_runnable()
        return len(rows)

    async def _fire_isolated(self, conn: store.Connection, row: Any, now: datetime | None) -> int:
        """Fire one slot inside a savepoint, so one bad trigger cannot stop the others."""
        try:
            async with store.transaction(conn):
                return await self._fire(conn, row, now)
        except Exception as exc:  # noqa: BLE001 - logged, retried later
            log.error("schedule %s/%s could not fire slot %s: %s", row["workspace_id"],
                      row["trigger_id"], row["next_slot_at"].isoformat(), exc)  # fmt: skip
            retry_at = row["db_now"] + RETRY_FAILED_SLOT
            with contextlib.suppress(Exception):
                await store.postpone_schedule(
                    conn, row["workspace_id"], row["trigger_id"], row["next_slot_at"], retry_at
                )
            return 0

    async def _fire(self, conn: store.Connection, row: Any, now: datetime | None) -> int:
        """Record the due slot's event and run (unless the slot is too old), then advance."""
        settings = Settings.of(row)
        sched = schedules.Schedule.from_json(dict(settings.config))
        slot: datetime = row["next_slot_at"]
        started = 0
        if row["db_now"] - slot > timedelta(seconds=self._catchup):
            # Missed while no replica ran (or while disabled): skipped, not burst.
            log.info("schedule %s/%s skipped slot %s, older than the catch-up window",
                     settings.workspace_id, settings.trigger_id, slot.isoformat())  # fmt: skip
        else:
            lag = (row["db_now"] - row["next_fire_at"]).total_seconds()
            metrics.SCHEDULE_LAG.observe(max(0.0, lag))
            outcome = await admission.admit(conn, _slot_event(settings, row), self._defaults, now)
            started = int(outcome.created and outcome.run_id is not None)
        nxt = sched.following_slot(slot, row["db_now"], self._catchup)
        fire_at = sched.fire_time(nxt, settings.workspace_id, settings.trigger_id)
        await store.advance_schedule(
            conn, settings.workspace_id, settings.trigger_id, slot, nxt, fire_at
        )
        return started


def _slot_event(settings: Settings, row: Any) -> admission.Event:
    """One slot of a schedule as a trigger event, deduped on `agent_id:scheduled_for`."""
    slot: datetime = row["next_slot_at"]
    return settings.event(
        dedupe_key=schedules.dedupe_key(settings.agent_id, slot),
        payload={"scheduled_for": slot.isoformat(), "fire_at": row["next_fire_at"].isoformat()},
        input_text=f"{settings.config.get('input') or 'Scheduled run'}\n\n"
        f"(scheduled for {slot.isoformat()})",
        scheduled_for=slot,
    )
