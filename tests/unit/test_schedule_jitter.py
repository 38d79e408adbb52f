"""Schedules as pure functions: slots (cron in a time zone, intervals), jitter, catch-up."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from control_plane.triggers import schedule
from control_plane.triggers.schedule import Schedule, ScheduleError, jitter_offset

MONDAY_9 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def test_twenty_thousand_agents_at_the_same_minute_spread_over_five_minutes():
    window = 300
    offsets = [
        jitter_offset("acme", f"agent-{i}-weekday-morning", window).total_seconds()
        for i in range(20_000)
    ]
    per_second = Counter(int(o) for o in offsets)
    peak = max(per_second.values())
    print(
        f"\n20,000 agents, {window} s jitter window: per-second histogram max {peak}/s, "
        f"mean {20_000 / window:.1f}/s, seconds used {len(per_second)}/{window} "
        f"(without jitter: 20000 in one second)"
    )
    assert all(0 <= o < window for o in offsets)
    assert len(per_second) == window  # every second of the window gets some
    # Uniform would be ~67/s; a hash spreads binomially (sd ~8), so the peak stays near it.
    assert peak <= 110
    # Both ends of the window are used.
    assert min(offsets) < 1 and max(offsets) > window - 1


def test_jitter_is_deterministic_per_trigger_and_zero_without_a_window():
    a = jitter_offset("acme", "nightly", 600)
    assert a == jitter_offset("acme", "nightly", 600)
    assert a != jitter_offset("acme", "nightly-2", 600)
    assert a != jitter_offset("other", "nightly", 600)
    assert jitter_offset("acme", "nightly", 0) == timedelta(0)
    sched = Schedule(cron="0 9 * * 1-5", jitter_seconds=600)
    assert sched.fire_time(MONDAY_9, "acme", "nightly") == MONDAY_9 + a


def test_cron_slots_follow_the_time_zone_across_daylight_saving():
    paris = Schedule(cron="0 9 * * 1-5", time_zone="Europe/Paris")
    slot = datetime(2026, 3, 27, 12, tzinfo=UTC)  # a Friday; clocks go forward on Sunday 29th
    slots = []
    for _ in range(3):
        slot = paris.next_slot_after(slot)
        slots.append(slot)
    local = [s.astimezone(ZoneInfo("Europe/Paris")) for s in slots]
    assert [(t.day, t.hour) for t in local] == [(30, 9), (31, 9), (1, 9)]
    assert [s.hour for s in slots] == [7, 7, 7]  # 09:00 CEST is 07:00 UTC
    winter = paris.next_slot_after(datetime(2026, 1, 2, 12, tzinfo=UTC))
    assert (winter.day, winter.hour) == (5, 8)  # 09:00 CET is 08:00 UTC, next Monday


def test_interval_slots_are_aligned_to_the_epoch_and_strictly_after():
    every_minute = Schedule(interval_seconds=60)
    t = datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC)
    assert every_minute.next_slot_after(t) == datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
    assert every_minute.next_slot_after(datetime(2026, 1, 1, 0, 1, tzinfo=UTC)) == datetime(
        2026, 1, 1, 0, 2, tzinfo=UTC
    )


def test_catch_up_fires_every_recent_slot_and_skips_older_ones():
    every_minute = Schedule(interval_seconds=60)
    fired = datetime(2026, 1, 1, 0, 0, tzinfo=UTC)
    # Two minutes late: the next slot is the very next one (no slot is skipped).
    now = fired + timedelta(minutes=2)
    assert every_minute.following_slot(fired, now, 600) == fired + timedelta(minutes=1)
    # Three hours late with a ten-minute catch-up: resume ten minutes back, not three hours.
    now = fired + timedelta(hours=3)
    assert every_minute.following_slot(fired, now, 600) == now - timedelta(minutes=9)


def test_dedupe_key_is_agent_and_slot():
    assert schedule.dedupe_key("triage", MONDAY_9) == "triage:2026-01-05T09:00:00Z"


@pytest.mark.parametrize(
    ("cron", "zone", "interval", "jitter", "field"),
    [
        ("", "", 0, 0, "schedule"),
        ("* * * * *", "", 60, 0, "schedule"),
        ("61 * * * *", "", 0, 0, "schedule.cron"),
        ("* * * * * *", "", 0, 0, "schedule.cron"),
        ("0 9 * * *", "Mars/Olympus", 0, 0, "schedule.time_zone"),
        ("", "", 0.5, 0, "schedule.interval"),
        ("", "", 60, 60, "schedule.jitter"),
        ("*/5 * * * *", "", 0, 300, "schedule.jitter"),
        ("0 9 * * *", "", 0, -1, "schedule.jitter"),
    ],
)
def test_bad_schedules_name_their_field(cron, zone, interval, jitter, field):
    with pytest.raises(ScheduleError) as info:
        schedule.build(cron, zone, interval, jitter, MONDAY_9)
    assert info.value.field == field


def test_a_good_schedule_round_trips_through_its_stored_form():
    built = schedule.build("0 9 * * 1-5", "Europe/Paris", 0, 300, MONDAY_9)
    assert Schedule.from_json(built.to_json()) == built
