"""Schedules: cron (in a time zone) or interval slots, and deterministic jitter.

A schedule trigger stores its next slot and its fire time, the slot plus a
jitter offset. The offset is a hash of the trigger's identity scaled into the
jitter window: the same trigger fires at the same offset after every slot
(deterministic, reproducible on every replica), while thousands of triggers
that share a slot ("every weekday at 09:00") spread evenly over the window
instead of landing in the same second.

The scheduler fires slots one at a time, in order, so a slot is never skipped
while the control plane keeps up. After an outage it catches up only on the
slots of the last `catchup` seconds (the schedule's own window, else the
server's); older ones are skipped, not burst.

A schedule's overlap policy says what a slot does while runs it started are
still going (control_plane/triggers/overlap.py): skip, buffer_one, allow_all
(the default: what schedules did before policies) or cancel_other.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

MAX_JITTER_SECONDS = 6 * 3600
MIN_INTERVAL_SECONDS = 1
MAX_INTERVAL_SECONDS = 366 * 24 * 3600
MAX_CATCHUP_SECONDS = 366 * 24 * 3600
OVERLAP_POLICIES = ("skip", "buffer_one", "allow_all", "cancel_other")
DEFAULT_OVERLAP = "allow_all"
# How many slots ahead jitter is checked against (cron gaps vary).
_GAP_SAMPLES = 64


class ScheduleError(ValueError):
    """A schedule that cannot be used; `field` names the request field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem)
        self.field = field


def jitter_offset(workspace_id: str, trigger_id: str, window_seconds: float) -> timedelta:
    """The trigger's fixed offset in [0, window): a hash of its identity, millisecond grain."""
    if window_seconds <= 0:
        return timedelta(0)
    digest = hashlib.sha256(f"{workspace_id}/{trigger_id}".encode()).digest()
    fraction = int.from_bytes(digest[:8], "big") / 2**64
    return timedelta(milliseconds=int(fraction * window_seconds * 1000))


@dataclass(frozen=True)
class Schedule:
    """When a schedule trigger's slots are."""

    cron: str | None = None
    time_zone: str = "UTC"
    interval_seconds: int | None = None
    jitter_seconds: float = 0.0
    overlap: str = DEFAULT_OVERLAP
    # Slots at most this overdue are still fired after an outage; None: the server's.
    catchup_seconds: float | None = None

    def next_slot_after(self, moment: datetime) -> datetime:
        """The first slot strictly after `moment` (UTC)."""
        if self.interval_seconds:
            epoch = int(moment.timestamp() // self.interval_seconds + 1) * self.interval_seconds
            return datetime.fromtimestamp(epoch, UTC)
        assert self.cron is not None
        local = moment.astimezone(ZoneInfo(self.time_zone))
        nxt = croniter(self.cron, local).get_next(datetime)
        return nxt.astimezone(UTC)

    def fire_time(self, slot: datetime, workspace_id: str, trigger_id: str) -> datetime:
        return slot + jitter_offset(workspace_id, trigger_id, self.jitter_seconds)

    def following_slot(self, fired: datetime, now: datetime, catchup_seconds: float) -> datetime:
        """The slot after `fired`, skipping slots more than `catchup_seconds` overdue at `now`."""
        return self.next_slot_after(max(fired, now - timedelta(seconds=catchup_seconds)))

    def catchup(self, server_default: float) -> float:
        """The catch-up window in seconds: the schedule's own, else the server's."""
        return self.catchup_seconds if self.catchup_seconds is not None else server_default

    def slots_between(self, start: datetime, end: datetime, limit: int) -> list[datetime]:
        """The slots at or after `start` and before `end`, at most `limit` + 1 of them (so a
        caller can tell a range with too many)."""
        slots: list[datetime] = []
        slot = self.next_slot_after(start - timedelta(microseconds=1))
        while slot < end and len(slots) <= limit:
            slots.append(slot)
            slot = self.next_slot_after(slot)
        return slots

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "cron": self.cron,
            "time_zone": self.time_zone,
            "interval_seconds": self.interval_seconds,
            "jitter_seconds": self.jitter_seconds,
            "overlap": self.overlap,
        }
        if self.catchup_seconds is not None:
            data["catchup_seconds"] = self.catchup_seconds
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Schedule:
        catchup = data.get("catchup_seconds")
        return cls(
            cron=data.get("cron"),
            time_zone=data.get("time_zone") or "UTC",
            interval_seconds=data.get("interval_seconds"),
            jitter_seconds=float(data.get("jitter_seconds") or 0.0),
            overlap=data.get("overlap") or DEFAULT_OVERLAP,
            catchup_seconds=float(catchup) if catchup is not None else None,
        )


def build(
    cron: str,
    time_zone: str,
    interval_seconds: float,
    jitter_seconds: float,
    now: datetime,
    *,
    overlap: str = DEFAULT_OVERLAP,
    catchup_seconds: float | None = None,
) -> Schedule:
    """A validated schedule; raises ScheduleError naming the bad field."""
    schedule = _when(cron, time_zone, interval_seconds, jitter_seconds)
    _check_jitter(schedule, now)
    if overlap not in OVERLAP_POLICIES:
        raise ScheduleError("schedule.overlap_policy", f"must be one of {OVERLAP_POLICIES}")
    if catchup_seconds is not None and not (
        schedule.jitter_seconds < catchup_seconds <= MAX_CATCHUP_SECONDS
    ):
        raise ScheduleError(
            "schedule.catchup_window",
            f"must be longer than the jitter ({schedule.jitter_seconds:g} s) and at most "
            f"{MAX_CATCHUP_SECONDS} s",
        )
    return replace(schedule, overlap=overlap, catchup_seconds=catchup_seconds)


def _when(cron: str, time_zone: str, interval_seconds: float, jitter_seconds: float) -> Schedule:
    """The slots part of a schedule (cron in a zone, or an interval) and its jitter."""
    if bool(cron) == bool(interval_seconds):
        raise ScheduleError("schedule", "needs exactly one of cron and interval")
    if interval_seconds:
        if interval_seconds != int(interval_seconds) or not (
            MIN_INTERVAL_SECONDS <= interval_seconds <= MAX_INTERVAL_SECONDS
        ):
            raise ScheduleError(
                "schedule.interval",
                f"must be whole seconds between {MIN_INTERVAL_SECONDS} and {MAX_INTERVAL_SECONDS}",
            )
        return Schedule(interval_seconds=int(interval_seconds), jitter_seconds=jitter_seconds)
    zone = _check_zone(time_zone or "UTC")
    return Schedule(cron=_check_cron(cron), time_zone=zone, jitter_seconds=jitter_seconds)


def _check_cron(expression: str) -> str:
    fields = expression.split()
    if len(fields) != 5 or not croniter.is_valid(expression):
        raise ScheduleError(
            "schedule.cron", f"is not a five-field cron expression: {expression[:100]!r}"
        )
    return " ".join(fields)


def _check_zone(name: str) -> str:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(
            "schedule.time_zone", f"is not an IANA time zone: {name[:64]!r}"
        ) from None
    return name


def _check_jitter(schedule: Schedule, now: datetime) -> None:
    jitter = schedule.jitter_seconds
    if not 0 <= jitter <= MAX_JITTER_SECONDS:
        raise ScheduleError("schedule.jitter", f"must be between 0 and {MAX_JITTER_SECONDS} s")
    if jitter and jitter >= min_gap_seconds(schedule, now):
        raise ScheduleError("schedule.jitter", "must be shorter than the gap between slots")


def min_gap_seconds(schedule: Schedule, start: datetime) -> float:
    """The shortest gap between consecutive slots over the next few dozen slots."""
    if schedule.interval_seconds:
        return float(schedule.interval_seconds)
    slot = schedule.next_slot_after(start)
    gap = float("inf")
    for _ in range(_GAP_SAMPLES):
        following = schedule.next_slot_after(slot)
        gap = min(gap, (following - slot).total_seconds())
        slot = following
    return gap


def dedupe_key(agent_id: str, slot: datetime) -> str:
    """`agent_id:scheduled_for`, the slot in UTC ISO 8601."""
    return f"{agent_id}:{slot.astimezone(UTC).isoformat().replace('+00:00', 'Z')}"
