"""What a person does to a schedule: update it, pause or unpause it, backfill, trigger now.

Each operation runs in the caller's transaction (the servicer adds its audit row to it)
and locks the schedule first, so it never interleaves with a scheduler round firing the
same schedule on any replica (the round skips a locked schedule and takes it next time).
Slots fired here go through the same overlap policies and dedupe keys as the scheduler's
(control_plane/triggers/overlap.py): a backfill run twice starts nothing the second time.

Backfill and trigger-now act on a paused schedule too (a person asked for those runs, as
Temporal's do); what a pause stops is the scheduler. Unpausing moves a schedule to its
first slot after now: the slots it missed while paused never fire.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from control_plane.ground.errors import FailedPrecondition, InvalidArgument, NotFound
from control_plane.store import schedules as store
from control_plane.store import triggers as trigger_store
from control_plane.store.db import Connection, Record
from control_plane.triggers import overlap
from control_plane.triggers.schedule import Schedule, dedupe_key

MAX_BACKFILL_SLOTS = 1000


async def locked(conn: Connection, ws: str, trigger_id: str, now: datetime | None) -> Record:
    """The schedule, locked; NotFound or FailedPrecondition (another kind) otherwise."""
    row = await store.lock(conn, ws, trigger_id, now)
    if row is not None:
        return row
    other = await store.get_any(conn, ws, trigger_id)
    if other is None:
        raise NotFound(f"trigger {trigger_id!r} not found")
    raise FailedPrecondition(f"trigger {trigger_id!r} is a {other['kind']} trigger, not a schedule")


def schedule_of(row: Any) -> Schedule:
    return Schedule.from_json(json.loads(row["config"]))


async def update(
    conn: Connection,
    ws: str,
    trigger_id: str,
    sched: Schedule,
    input_text: str,
    now: datetime | None = None,
    priority: int | None = None,
) -> Record:
    """Replace the schedule's spec; its next slot is the new spec's first after now. The
    priority of its runs becomes `priority` (None: stays); their concurrency_key rule
    stays."""
    row = await locked(conn, ws, trigger_id, now)
    slot = sched.next_slot_after(row["db_now"])
    config = {**sched.to_json(), "input": input_text}
    old = json.loads(row["config"])
    if priority is None:
        priority = old.get("priority", 0)
    if priority:
        config["priority"] = priority
    if old.get("concurrency_key"):
        config["concurrency_key"] = old["concurrency_key"]
    fire_at = sched.fire_time(slot, ws, trigger_id)
    updated = await store.update(conn, ws, trigger_id, config, slot, fire_at)
    assert updated is not None, "the schedule is locked"
    return updated


async def set_paused(
    conn: Connection,
    ws: str,
    trigger_id: str,
    *,
    enabled: bool,
    note: str | None,
    now: datetime | None = None,
) -> Record:
    """Pause or unpause any trigger with a note; an unpaused schedule skips what it missed."""
    row = await store.lock_any(conn, ws, trigger_id)
    if row is None:
        raise NotFound(f"trigger {trigger_id!r} not found")
    slot = fire_at = None
    if row["kind"] == "schedule" and enabled and not row["enabled"]:
        sched = schedule_of(row)
        current = await store.lock(conn, ws, trigger_id, now)
        assert current is not None
        slot = sched.next_slot_after(current["db_now"])
        fire_at = sched.fire_time(slot, ws, trigger_id)
    updated = await store.pause(conn, ws, trigger_id, enabled, note, slot, fire_at)
    assert updated is not None, "the trigger is locked"
    return updated


@dataclass(frozen=True)
class Backfilled:
    slots: int
    counts: Counter[overlap.Fired]


async def backfill(
    conn: Connection,
    ws: str,
    trigger_id: str,
    start: datetime,
    end: datetime,
    policy: str | None,
    firing: overlap.Firing,
) -> Backfilled:
    """Fire each slot in [start, end) in order under `policy` (None: the schedule's)."""
    if end <= start:
        raise InvalidArgument("end_time", "must be after start_time")
    row = await locked(conn, ws, trigger_id, firing.now)
    sched = schedule_of(row)
    slots = sched.slots_between(start, end, MAX_BACKFILL_SLOTS)
    if len(slots) > MAX_BACKFILL_SLOTS:
        raise InvalidArgument(
            "end_time", f"the range holds more than {MAX_BACKFILL_SLOTS} slots; backfill in parts"
        )
    counts: Counter[overlap.Fired] = Counter()
    policy = policy or sched.overlap
    for at in slots:
        slot = overlap.Slot(at, dedupe_key(row["agent_id"], at), origin="backfill")
        counts[await overlap.fire(conn, row, slot, policy, firing)] += 1
        if policy == "buffer_one":
            row = await locked(conn, ws, trigger_id, firing.now)  # its buffer may have changed
    return Backfilled(len(slots), counts)


@dataclass(frozen=True)
class TriggeredNow:
    fired: overlap.Fired
    event: Record | None  # None while buffered


async def trigger_now(
    conn: Connection,
    ws: str,
    trigger_id: str,
    request_id: str | None,
    policy: str | None,
    firing: overlap.Firing,
) -> TriggeredNow:
    """Fire the schedule once now (database time), deduped on `agent_id:now:<request_id>`."""
    row = await locked(conn, ws, trigger_id, firing.now)
    key = f"{row['agent_id']}:now:{request_id or uuid.uuid4().hex}"
    slot = overlap.Slot(row["db_now"], key, origin="now")
    fired = await overlap.fire(conn, row, slot, policy or schedule_of(row).overlap, firing)
    event = await trigger_store.event_by_key(conn, ws, trigger_id, key)
    return TriggeredNow(fired, event)
