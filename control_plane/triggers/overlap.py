"""Overlap policies: what one slot of a schedule does while runs it started are still going.

Every way a slot fires comes here: the scheduler's due slots and released buffers
(control_plane/triggers/scheduler.py), a backfill and a trigger-now (schedule_ops.py). The caller
holds the schedule's row locked (FOR UPDATE, or SKIP LOCKED in the scheduler), so for one
schedule the check and the act below are never interleaved with another firing, on any
replica. First the slot's dedupe key is looked up: a slot that already has its event
(fired by another round, a backfill run twice) does nothing, whatever the policy, and in
particular cancels nothing. Then, with the runs the schedule started that are still going
(queued, running or waiting):

* allow_all — the slot starts its run regardless;
* skip — if any is going, the slot's event is recorded as filtered, naming the run; the
  dedupe key then remembers it like a fired slot;
* buffer_one — if any is going, the slot is kept in the schedule's one-slot buffer (with its
  dedupe key) and fires once none is; a slot that comes while the buffer is full is skipped;
* cancel_other — the runs going are cancelled (their finish step says by which schedule and
  for which slot; a holder is fenced at its next commit or heartbeat), then the slot starts.

The unique (trigger, dedupe_key) of trigger_events stays the backstop for all of it.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from control_plane.ground.config import RunDefaults
from control_plane.ops import run_figures
from control_plane.store import runs as run_store
from control_plane.store import schedules as store
from control_plane.store import triggers as trigger_store
from control_plane.triggers import admission
from control_plane.triggers.deliveries import Settings

log = logging.getLogger(__name__)


class Fired(StrEnum):
    STARTED = "started"
    ALREADY = "already"  # the slot's event exists (fired before)
    SKIPPED = "skipped"
    BUFFERED = "buffered"


@dataclass(frozen=True)
class Slot:
    """One slot to fire: when (`at`, the event's scheduled_for) and its dedupe key."""

    at: datetime
    dedupe_key: str
    origin: str = "schedule"  # schedule, buffer, backfill, now
    fire_at: datetime | None = None


@dataclass
class Firing:
    """What firing needs besides the slot (run defaults, the clock), and what it did that
    the caller tells others once its transaction commits."""

    defaults: RunDefaults
    now: datetime | None = None
    started: int = 0
    cancelled: list[tuple[str, uuid.UUID]] = field(default_factory=list)

    def committed(
        self, on_runnable: Callable[[], None], on_cancel: Callable[[str, uuid.UUID], None] | None
    ) -> None:
        """After the commit: wake the dispatcher for new runs, stop the cancelled ones."""
        if self.started:
            on_runnable()
        if on_cancel is not None:
            for ws, run_id in self.cancelled:
                on_cancel(ws, run_id)


def _json(text: str) -> Any:
    """A schedule's input as a JSON document (what a concurrency_key path reads), or None."""
    try:
        return json.loads(text)
    except ValueError:
        return None


def _event(settings: Settings, slot: Slot, filtered: str | None = None) -> admission.Event:
    payload: dict[str, Any] = {"scheduled_for": slot.at.isoformat(), "origin": slot.origin}
    if slot.fire_at is not None:
        payload["fire_at"] = slot.fire_at.isoformat()
    return settings.event(
        dedupe_key=slot.dedupe_key,
        payload=payload,
        key_source=_json(settings.config.get("input") or ""),
        filtered=filtered,
        scheduled_for=slot.at,
        input_text=f"{settings.config.get('input') or 'Scheduled run'}\n\n"
        f"(scheduled for {slot.at.isoformat()})",
    )


async def admit(
    conn: trigger_store.Connection,
    settings: Settings,
    slot: Slot,
    firing: Firing,
    filtered: str | None = None,
) -> Fired:
    """Record the slot's event (and its run unless `filtered`) once per dedupe key."""
    event = _event(settings, slot, filtered)
    outcome = await admission.admit(conn, event, firing.defaults, firing.now)
    if not outcome.created:
        return Fired.ALREADY
    if filtered:
        return Fired.SKIPPED
    firing.started += 1
    return Fired.STARTED


async def fire(
    conn: trigger_store.Connection, row: Any, slot: Slot, policy: str, firing: Firing
) -> Fired:
    """Fire `slot` of the locked schedule `row` under `policy` (see the module docstring)."""
    settings = Settings.of(row)
    ws, trigger_id = settings.workspace_id, settings.trigger_id
    if await trigger_store.event_by_key(conn, ws, trigger_id, slot.dedupe_key) is not None:
        return Fired.ALREADY
    if policy == "allow_all":
        return await admit(conn, settings, slot, firing)
    going = await store.active_runs(conn, ws, trigger_id, settings.agent_id)
    if policy == "cancel_other":
        await _cancel(conn, settings, slot, going, firing)
        return await admit(conn, settings, slot, firing)
    if policy == "buffer_one":
        return await _buffer_one(conn, row, settings, slot, bool(going), firing)
    if going:
        run_id, status = going[-1]
        reason = f"overlap policy skip: run {run_id} of this schedule is still {status}"
        return await admit(conn, settings, slot, firing, filtered=reason)
    return await admit(conn, settings, slot, firing)


async def _buffer_one(
    conn: trigger_store.Connection,
    row: Any,
    settings: Settings,
    slot: Slot,
    going: bool,
    firing: Firing,
) -> Fired:
    buffered = row["buffered_slot_at"]
    if buffered is not None and not going:
        # The buffer's run may start now (a release this round has not made yet): it goes
        # first, in slot order, and this slot takes the buffer.
        await release(conn, row, firing)
        buffered, going = None, True
    if not going:
        return await admit(conn, settings, slot, firing)
    if buffered is None:
        ws, trigger_id = settings.workspace_id, settings.trigger_id
        await store.buffer(conn, ws, trigger_id, slot.at, slot.dedupe_key)
        return Fired.BUFFERED
    if row["buffered_dedupe_key"] == slot.dedupe_key:
        return Fired.BUFFERED  # the same slot again (a retried trigger-now): still buffered
    reason = f"overlap policy buffer_one: slot {buffered.isoformat()} is already buffered"
    return await admit(conn, settings, slot, firing, filtered=reason)


async def release(conn: trigger_store.Connection, row: Any, firing: Firing) -> Fired:
    """Fire the schedule's buffered slot (no run of the schedule is going) and empty it."""
    settings = Settings.of(row)
    slot = Slot(row["buffered_slot_at"], row["buffered_dedupe_key"], origin="buffer")
    await store.unbuffer(conn, settings.workspace_id, settings.trigger_id)
    return await admit(conn, settings, slot, firing)


async def _cancel(
    conn: trigger_store.Connection,
    settings: Settings,
    slot: Slot,
    going: list[tuple[uuid.UUID, str]],
    firing: Firing,
) -> None:
    reason = (
        f"cancelled by schedule {settings.trigger_id} (overlap policy cancel_other) for its "
        f"slot {slot.at.isoformat()}"
    )
    for run_id, _ in going:
        ws = settings.workspace_id
        if (row := await run_store.cancel_run(conn, ws, run_id, reason, firing.now)) is not None:
            run_figures.FIGURES.cancelled(row)
            firing.cancelled.append((ws, run_id))
        log.info(
            "schedule %s/%s cancelled run %s for slot %s",
            settings.workspace_id,
            settings.trigger_id,
            run_id,
            slot.at.isoformat(),
        )
