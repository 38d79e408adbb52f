"""Schedule policies against real Postgres on a controlled clock: overlap policies over runs
that outlast their interval, pause, backfill, and two scheduler replicas racing."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from control_plane.ground.config import RunDefaults
from control_plane.store import lease, runs, steps
from control_plane.store import triggers as store
from control_plane.triggers import overlap, schedule_ops
from control_plane.triggers.schedule import Schedule
from control_plane.triggers.scheduler import Scheduler
from tests import factories

WS = "ws"
T = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
EVERY_MINUTE = Schedule(interval_seconds=60)


@pytest.fixture
async def pools(db_url):
    """Two pools: one per scheduler replica."""
    made = [await asyncpg.create_pool(db_url, min_size=1, max_size=4) for _ in range(2)]
    await factories.agent_version(made[0], WS, "agent")
    yield made
    for pool in made:
        await pool.close()


@pytest.fixture
async def pool(pools):
    return pools[0]


async def add_schedule(pool, trigger_id: str, policy: str, slot: datetime = T) -> None:
    sched = Schedule(interval_seconds=60, overlap=policy)
    new = store.NewTrigger(
        workspace_id=WS,
        trigger_id=trigger_id,
        agent_id="agent",
        kind="schedule",
        scheme=None,
        config={**sched.to_json(), "input": "digest"},
        filters=[],
        next_slot_at=slot,
        next_fire_at=sched.fire_time(slot, WS, trigger_id),
    )
    assert await store.create_trigger(pool, new, None) is not None


def scheduler(pool, cancelled: list | None = None) -> Scheduler:
    hook = (lambda ws, run_id: cancelled.append(run_id)) if cancelled is not None else None
    return Scheduler(pool, RunDefaults(), lambda: None, on_cancel=hook)


async def events(db, trigger_id: str = "sched") -> list[asyncpg.Record]:
    return await db.fetch(
        "SELECT e.scheduled_for, e.status, e.reason, e.run_id, r.status AS run_status, r.error"
        " FROM trigger_events e LEFT JOIN runs r USING (workspace_id, run_id)"
        " WHERE e.trigger_id = $1 ORDER BY e.received_at, e.scheduled_for",
        trigger_id,
    )


async def complete_the_running_one(pool, now: datetime) -> None:
    """An executor takes the one queued run and completes it (the store's commit path)."""
    (held,) = await lease.claim_due(pool, ["ex"], 30, now=now)
    decision = steps.NewStep(1, "model_decision", None, json.dumps({"content": "done"}))
    done = steps.Transition("completed", text="done")
    req = steps.CommitRequest(WS, held.run_id, held.lease_epoch, [decision], done, model_calls=1)
    await steps.commit(pool, req, 30, now=now)


async def test_allow_all_starts_every_slot_while_earlier_runs_go_on(pool, db):
    await add_schedule(pool, "sched", "allow_all")
    for m in range(3):
        await scheduler(pool).tick(T + m * MINUTE)
    got = await events(db)
    assert [(e["status"], e["run_status"]) for e in got] == [("accepted", "queued")] * 3


async def test_skip_records_the_slots_that_come_while_a_run_goes_on(pool, db):
    await add_schedule(pool, "sched", "skip")
    for m in range(3):  # the first run outlasts three intervals
        await scheduler(pool).tick(T + m * MINUTE)
    await complete_the_running_one(pool, T + 2.5 * MINUTE)
    await scheduler(pool).tick(T + 3 * MINUTE)
    got = await events(db)
    assert [e["status"] for e in got] == ["accepted", "filtered", "filtered", "accepted"]
    first = got[0]["run_id"]
    assert all(f"run {first} of this schedule is still queued" in e["reason"] for e in got[1:3])
    assert [e["scheduled_for"] for e in got] == [T + m * MINUTE for m in range(4)]
    assert await db.fetchval("SELECT count(*) FROM runs") == 2


async def test_buffer_one_keeps_one_slot_and_starts_it_when_the_run_ends(pool, db):
    await add_schedule(pool, "sched", "buffer_one")
    for m in range(3):
        await scheduler(pool).tick(T + m * MINUTE)
    assert await db.fetchval("SELECT buffered_slot_at FROM triggers") == T + MINUTE
    got = await events(db)
    assert [(e["scheduled_for"], e["status"]) for e in got] == [
        (T, "accepted"),
        (T + 2 * MINUTE, "filtered"),
    ]
    assert f"slot {(T + MINUTE).isoformat()} is already buffered" in got[1]["reason"]
    # Nothing is released while the run goes on; once it ends, the buffered slot starts.
    await scheduler(pool).tick(T + 2.2 * MINUTE)
    assert len(await events(db)) == 2
    await complete_the_running_one(pool, T + 2.5 * MINUTE)
    await scheduler(pool).tick(T + 2.6 * MINUTE)
    got = await events(db)
    assert [(e["scheduled_for"], e["status"], e["run_status"]) for e in got][2] == (
        T + MINUTE,
        "accepted",
        "queued",
    )
    assert await db.fetchval("SELECT buffered_slot_at FROM triggers") is None
    # The next slot finds that run going: it is buffered in turn.
    await scheduler(pool).tick(T + 3 * MINUTE)
    assert await db.fetchval("SELECT buffered_slot_at FROM triggers") == T + 3 * MINUTE


async def test_cancel_other_cancels_the_run_going_and_fences_its_holder(pool, db):
    await add_schedule(pool, "sched", "cancel_other")
    cancelled: list = []
    await scheduler(pool, cancelled).tick(T)
    (held,) = await lease.claim_due(pool, ["ex"], 30, now=T + timedelta(seconds=5))
    for m in (1, 2):
        await scheduler(pool, cancelled).tick(T + m * MINUTE)
    got = await events(db)
    assert [(e["status"], e["run_status"]) for e in got] == [
        ("accepted", "cancelled"),
        ("accepted", "cancelled"),
        ("accepted", "queued"),
    ]
    assert "cancel_other" in got[0]["error"] and (T + MINUTE).isoformat() in got[0]["error"]
    assert cancelled == [got[0]["run_id"], got[1]["run_id"]]  # the executor is told, too
    decision = steps.NewStep(1, "model_decision", None, json.dumps({"content": "late"}))
    late = steps.CommitRequest(WS, held.run_id, held.lease_epoch, [decision])
    with pytest.raises(steps.Fenced):  # the cancelled run's holder writes nothing more
        await steps.commit(pool, late, 30, now=T + 70 * timedelta(seconds=1))


async def test_a_paused_schedule_fires_nothing_and_unpausing_skips_what_it_missed(pool, db):
    await add_schedule(pool, "sched", "allow_all")
    await add_schedule(pool, "buffered", "buffer_one")
    await scheduler(pool).tick(T)
    await scheduler(pool).tick(T + MINUTE)  # "buffered" now holds slot T+1min
    async with store.transaction(pool) as conn:
        for trigger_id in ("sched", "buffered"):
            row = await schedule_ops.set_paused(
                conn, WS, trigger_id, enabled=False, note="maintenance window"
            )
            assert (row["enabled"], row["note"]) == (False, "maintenance window")
    before = await db.fetchval("SELECT count(*) FROM trigger_events")
    (first,) = await events(db, "buffered")
    await runs.cancel_run(pool, WS, first["run_id"], "ended", now=T + 1.5 * MINUTE)
    # The buffer could go now, and slots keep coming: a paused schedule fires none of it.
    for second in range(90, 600, 30):  # well inside the 10-minute catch-up window
        assert await scheduler(pool).tick(T + timedelta(seconds=second)) == 0
    assert await db.fetchval("SELECT count(*) FROM trigger_events") == before
    resumed = T + timedelta(seconds=610)
    async with store.transaction(pool) as conn:
        row = await schedule_ops.set_paused(
            conn, WS, "sched", enabled=True, note="back", now=resumed
        )
    assert row["next_slot_at"] == T + 11 * MINUTE  # the first slot after now, none missed
    await scheduler(pool).tick(resumed)
    await scheduler(pool).tick(T + 11 * MINUTE)
    slots = [e["scheduled_for"] for e in await events(db)]
    assert slots == [T, T + MINUTE, T + 11 * MINUTE]
    assert len(await events(db, "buffered")) == 1  # still paused: its buffer stays


async def backfill(pool, trigger_id: str, start: datetime, end: datetime) -> tuple:
    firing = overlap.Firing(RunDefaults())
    async with store.transaction(pool) as conn:
        done = await schedule_ops.backfill(conn, WS, trigger_id, start, end, None, firing)
    return done.slots, firing.started, done.counts[overlap.Fired.ALREADY]


async def test_a_backfill_of_100_slots_run_twice_starts_100_runs(pools, pool, db):
    await add_schedule(pool, "sched", "allow_all", slot=T + timedelta(days=1))
    start, end = T - 100 * MINUTE, T
    results = [await backfill(pool, "sched", start, end) for _ in range(2)]
    assert results == [(100, 100, 0), (100, 0, 100)]
    assert await db.fetchval("SELECT count(*) FROM runs") == 100
    # Twice at once, from two replicas, over a range that overlaps it: the second waits for
    # the first's lock, then finds every slot it shares already fired.
    wider = await asyncio.gather(*(backfill(p, "sched", start, end + 10 * MINUTE) for p in pools))
    assert sorted(wider) == [(110, 0, 110), (110, 10, 100)]
    assert await db.fetchval("SELECT count(*) FROM runs") == 110
    got = await events(db)
    assert sorted(e["scheduled_for"] for e in got) == [start + m * MINUTE for m in range(110)]
    # Under skip, a backfill's slots overlap each other: the first starts, the rest skip.
    await add_schedule(pool, "skipper", "skip", slot=T + timedelta(days=1))
    firing = overlap.Firing(RunDefaults())
    async with store.transaction(pool) as conn:
        done = await schedule_ops.backfill(
            conn, WS, "skipper", start, start + 5 * MINUTE, None, firing
        )
    assert (firing.started, done.counts[overlap.Fired.SKIPPED]) == (1, 4)


async def test_the_catch_up_window_is_the_schedules_own(pool, db):
    """After a 30-minute outage, a schedule with a 2-minute window fires only the slots
    of the last 2 minutes; one without keeps the server's 10."""
    await add_schedule(pool, "sched", "allow_all")
    short = Schedule(interval_seconds=60, catchup_seconds=120)
    new = store.NewTrigger(
        workspace_id=WS,
        trigger_id="short",
        agent_id="agent",
        kind="schedule",
        scheme=None,
        config={**short.to_json(), "input": "digest"},
        filters=[],
        next_slot_at=T,
        next_fire_at=T,
    )
    assert await store.create_trigger(pool, new, None) is not None
    now = T + 30 * MINUTE
    await scheduler(pool).tick(now)
    fired = [e["scheduled_for"] for e in await events(db, "short")]
    assert fired == [now - MINUTE, now]  # slots less than 120 s overdue (as for the server's)
    assert len(await events(db, "sched")) == 10  # the server's 600 s window


async def test_two_replicas_agree_on_every_policy(pools, db):
    """Both replicas tick at every minute at once; runs last three intervals. Each policy's
    outcome is the one a single scheduler gives, and no slot fires twice."""
    for policy in ("allow_all", "skip", "buffer_one", "cancel_other"):
        await add_schedule(pools[0], policy, policy)
    replicas = [scheduler(p) for p in pools]
    for m in range(12):
        now = T + m * MINUTE
        await asyncio.gather(*(r.tick(now) for r in replicas))
        if m % 3 == 2:  # every run going ends before the next slot
            for row in await db.fetch(
                "SELECT run_id FROM runs WHERE status IN ('queued', 'running', 'waiting')"
            ):
                await runs.cancel_run(pools[0], WS, row["run_id"], "ended", now=now + MINUTE / 2)
    started = {
        policy: [e["scheduled_for"] for e in await events(db, policy) if e["status"] == "accepted"]
        for policy in ("allow_all", "skip", "buffer_one", "cancel_other")
    }
    every = [T + m * MINUTE for m in range(12)]
    assert started["allow_all"] == every
    assert started["cancel_other"] == every
    assert started["skip"] == [T + m * MINUTE for m in (0, 3, 6, 9)]
    # Slot 1 waited for slot 0's run, 3 for 1's, 6 for 3's; 9 waits for 6's (ended at 11.5).
    assert started["buffer_one"] == [T + m * MINUTE for m in (0, 1, 3, 6)]
    buffered = await db.fetchval(
        "SELECT buffered_slot_at FROM triggers WHERE trigger_id = $1", "buffer_one"
    )
    assert buffered == T + 9 * MINUTE
    cancelled_by_policy = await db.fetchval(
        "SELECT count(*) FROM runs WHERE error LIKE '%cancel_other%'"
    )
    assert cancelled_by_policy == 8  # slots 1, 2, 4, 5, 7, 8, 10, 11 each cancelled one
    per_slot = await db.fetch(
        "SELECT trigger_id, scheduled_for, count(*) FROM trigger_events"
        " GROUP BY 1, 2 HAVING count(*) > 1"
    )
    assert per_slot == []
