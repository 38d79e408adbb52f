"""The scheduler against real Postgres: replicas racing over slots, jitter, real processes."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from agentrun.v1 import trigger_pb2
from control_plane.ground.config import RunDefaults
from control_plane.store import triggers as store
from control_plane.triggers import admission
from control_plane.triggers.schedule import Schedule, dedupe_key
from control_plane.triggers.scheduler import Scheduler
from tests import factories
from tests.harness.triggers import TriggerApi, seconds
from tests.harness.waiting import eventually

WS = "ws"
MONDAY_9 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


@pytest.fixture
async def pools(db_url):
    """Two pools: one per scheduler replica."""
    made = [await asyncpg.create_pool(db_url, min_size=1, max_size=4) for _ in range(2)]
    yield made
    for pool in made:
        await pool.close()


async def add_schedule(
    pool, trigger_id: str, sched: Schedule, slot: datetime, agent="agent"
) -> None:
    new = store.NewTrigger(
        workspace_id=WS,
        trigger_id=trigger_id,
        agent_id=agent,
        kind="schedule",
        scheme=None,
        config={**sched.to_json(), "input": "morning digest"},
        filters=[],
        next_slot_at=slot,
        next_fire_at=sched.fire_time(slot, WS, trigger_id),
    )
    assert await store.create_trigger(pool, new, None) is not None


def replica(pool, **kw) -> Scheduler:
    return Scheduler(pool, RunDefaults(), lambda: None, **kw)


async def test_two_replicas_over_1000_slots_fire_each_exactly_once(pools, db):
    await factories.agent_version(pools[0], WS, "agent")
    every_minute = Schedule(interval_seconds=60)
    for i in range(4):
        await add_schedule(pools[0], f"sched-{i}", every_minute, MONDAY_9)
    now = MONDAY_9 + timedelta(minutes=249)  # 250 slots due per trigger, 1,000 in all
    replicas = [replica(p, batch=1, catchup_seconds=10**6) for p in pools]
    fired = [0, 0]
    while True:  # both replicas race until a round where neither finds anything due
        counts = await asyncio.gather(*(r.tick(now) for r in replicas))
        fired = [f + c for f, c in zip(fired, counts, strict=True)]
        if counts == [0, 0]:
            break
    print(f"\nreplica A fired {fired[0]} slots, replica B fired {fired[1]} (1,000 slots)")
    rows = await db.fetch(
        "SELECT e.trigger_id, e.scheduled_for, e.dedupe_key, r.run_id FROM trigger_events e "
        "JOIN runs r USING (workspace_id, run_id)"
    )
    assert len(rows) == 1000 and sum(fired) == 1000 and min(fired) > 0
    assert await db.fetchval("SELECT count(*) FROM runs") == 1000
    per_trigger = Counter(r["trigger_id"] for r in rows)
    assert set(per_trigger.values()) == {250}
    expected = {MONDAY_9 + timedelta(minutes=m) for m in range(250)}
    for i in range(4):
        slots = {r["scheduled_for"] for r in rows if r["trigger_id"] == f"sched-{i}"}
        assert slots == expected
    assert {r["dedupe_key"] for r in rows} == {dedupe_key("agent", s) for s in expected}
    nxt = await db.fetchval("SELECT min(next_slot_at) FROM triggers")
    assert nxt == MONDAY_9 + timedelta(minutes=250)


async def test_a_slot_fired_twice_past_the_lock_still_starts_one_run(pools, db):
    """The dedupe key is the backstop should two replicas ever both fire a slot."""
    await factories.agent_version(pools[0], WS, "agent")
    event = admission.Event(
        workspace_id=WS,
        trigger_id="sched",
        agent_id="agent",
        kind="schedule",
        dedupe_key=dedupe_key("agent", MONDAY_9),
        payload={},
        input_text="digest",
        scheduled_for=MONDAY_9,
    )
    await add_schedule(pools[0], "sched", Schedule(interval_seconds=60), MONDAY_9)
    outcomes = await asyncio.gather(
        *(admission.admit(p, event, RunDefaults()) for p in (*pools, *pools))
    )
    assert sorted(o.created for o in outcomes) == [False, False, False, True]
    assert len({o.run_id for o in outcomes}) == 1
    assert await db.fetchval("SELECT count(*) FROM runs") == 1


async def test_jitter_spreads_a_shared_slot_over_the_window(pools, db):
    await factories.agent_version(pools[0], WS, "agent")
    weekday_morning = Schedule(cron="0 9 * * 1-5", time_zone="UTC", jitter_seconds=300)
    n = 600
    for i in range(n):
        await add_schedule(pools[0], f"agent-{i}", weekday_morning, MONDAY_9)
    scheduler = replica(pools[0])
    for second in range(-2, 302):  # the clock walks through the window, one tick a second
        await scheduler.tick(MONDAY_9 + timedelta(seconds=second))
    rows = await db.fetch(
        "SELECT e.trigger_id, r.created_at, r.status FROM trigger_events e "
        "JOIN runs r USING (workspace_id, run_id)"
    )
    assert len(rows) == n and len({r["trigger_id"] for r in rows}) == n
    offsets = []
    for r in rows:
        fire_at = weekday_morning.fire_time(MONDAY_9, WS, r["trigger_id"])
        # Created at the first tick at or after its own fire time, never before.
        assert timedelta(0) <= r["created_at"] - fire_at < timedelta(seconds=1)
        offsets.append((r["created_at"] - MONDAY_9).total_seconds())
    per_second = Counter(int(o) for o in offsets)
    print(
        f"\n{n} schedules at 09:00 with a 300 s jitter window: runs created over "
        f"{min(offsets):.1f}-{max(offsets):.1f} s, per-second histogram max {max(per_second.values())}"
    )
    assert min(offsets) < 10 and max(offsets) > 290
    assert max(per_second.values()) <= 10  # without jitter: 600 in the same second
    # Admitted as queued: above a workspace's cap they simply wait there.
    assert {r["status"] for r in rows} == {"queued"}
    tuesday = await db.fetchval("SELECT min(next_slot_at) FROM triggers")
    assert tuesday == MONDAY_9 + timedelta(days=1)


async def test_two_control_plane_replicas_fire_an_interval_schedule_once_per_slot(
    db_url, control_plane, db
):
    fast = {"AGENTRUN_SCHEDULER_POLL_SECONDS": "0.05"}
    replicas = [control_plane(db_url, **fast) for _ in range(2)]
    api = await TriggerApi.connect(replicas[0].address, db_url, WS)
    await api.publish("ticker")
    await api.create(
        "every-second",
        "ticker",
        schedule=trigger_pb2.ScheduleSource(interval=seconds(1), input="tick"),
    )

    async def enough_slots():
        return await db.fetchval("SELECT count(*) FROM trigger_events") >= 6

    await eventually(enough_slots, timeout=30, message="six slots fired")
    replicas[0].kill()  # the other replica carries on alone
    seen = await db.fetchval("SELECT count(*) FROM trigger_events")

    async def more_slots():
        return await db.fetchval("SELECT count(*) FROM trigger_events") >= seen + 3

    await eventually(more_slots, timeout=30, message="the surviving replica fires on")
    rows = await db.fetch(
        "SELECT e.scheduled_for, e.run_id FROM trigger_events e ORDER BY e.scheduled_for"
    )
    slots = [r["scheduled_for"] for r in rows]
    assert len(set(slots)) == len(slots) == await db.fetchval("SELECT count(*) FROM runs")
    # Consecutive seconds: no slot skipped, none fired twice.
    assert all((b - a) == timedelta(seconds=1) for a, b in zip(slots, slots[1:], strict=False))
    await api.close()


async def test_after_an_outage_only_the_catch_up_window_is_fired(pools, db):
    await factories.agent_version(pools[0], WS, "agent")
    await add_schedule(pools[0], "minutely", Schedule(interval_seconds=60), MONDAY_9)
    now = MONDAY_9 + timedelta(hours=3)  # no replica ran for three hours
    fired = await replica(pools[0], catchup_seconds=600).tick(now)
    slots = [
        r["scheduled_for"]
        for r in await db.fetch("SELECT scheduled_for FROM trigger_events ORDER BY scheduled_for")
    ]
    # The three-hour-old slot is skipped; the last ten minutes' slots fire, once each.
    assert slots == [now - timedelta(minutes=m) for m in range(9, -1, -1)]
    assert fired == 11  # ten slots fired plus the stale one skipped
    assert await db.fetchval("SELECT next_slot_at FROM triggers") == now + timedelta(minutes=1)
