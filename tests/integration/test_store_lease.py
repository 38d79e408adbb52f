"""The run row as a lease: claims, fenced commits, heartbeats, parks, cancels (real Postgres)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections import Counter
from datetime import timedelta

import asyncpg
import pytest

from control_plane.store import approvals, lease, runs, steps, workspaces
from control_plane.store.errors import DataRefused, Fenced
from control_plane.store.queries import QUERIES
from tests import factories
from tests.harness.waiting import eventually


@pytest.fixture
async def pool(db_url):
    p = await asyncpg.create_pool(db_url, min_size=1, max_size=12)
    yield p
    await p.close()


def step(seq: int, kind: str = "model_decision", ref: int | None = None) -> steps.NewStep:
    return steps.NewStep(seq, kind, ref, json.dumps({"content": f"s{seq}", "tool_calls": []}))


def key(row) -> lease.LeaseKey:
    return lease.LeaseKey(row.workspace_id, row.run_id, row.lease_epoch)


async def test_every_named_query_prepares(db):
    for query in QUERIES.values():
        await db.prepare(query.sql)


async def test_the_typed_rows_name_every_column_of_their_tables(db):
    """A column a migration adds must reach Run and Approval (from_record reads by name)."""
    for table, row_type, computed in (
        ("runs", runs.Run, {"held_seconds"}),
        ("approvals", approvals.Approval, set()),
    ):
        columns = await db.fetch(
            "SELECT column_name FROM information_schema.columns WHERE table_name = $1", table
        )
        names = {f.name for f in dataclasses.fields(row_type)}
        assert names - computed == {c["column_name"] for c in columns}, table


async def test_claim_sets_lease_and_bumps_epoch(pool):
    (run,) = await factories.queued_runs(pool, 1)
    (claimed,) = await lease.claim_due(pool, ["ex-a"], 30)
    assert claimed.run_id == run.run_id
    assert claimed.status == "running"
    assert claimed.lease_owner == "ex-a"
    assert claimed.lease_epoch == run.lease_epoch + 1
    assert claimed.attempt == 0
    # Held: nobody else can claim it while the lease runs.
    assert await lease.claim_due(pool, ["ex-b"], 30) == []


async def test_lapsed_lease_is_claimable_again_and_fences_the_old_holder(pool):
    (run,) = await factories.queued_runs(pool, 1)
    (a,) = await lease.claim_due(pool, ["ex-a"], 30)
    later = a.wake_at + timedelta(seconds=1)
    (b,) = await lease.claim_due(pool, ["ex-b"], 30, now=later)
    assert (b.lease_owner, b.lease_epoch, b.attempt) == ("ex-b", a.lease_epoch + 1, 1)

    stale = steps.CommitRequest(run.workspace_id, run.run_id, a.lease_epoch, [step(1)])
    with pytest.raises(Fenced):
        await steps.commit(pool, stale, 30)
    beat = await lease.heartbeat(pool, "ex-a", [key(a)], 30)
    assert beat.renewed == {}

    fresh = steps.CommitRequest(run.workspace_id, run.run_id, b.lease_epoch, [step(1)])
    assert (await steps.commit(pool, fresh, 30)).status == "running"
    log = await steps.list_steps(pool, run.workspace_id, run.run_id, 0, 100)
    assert [(s.seq, s.epoch) for s in log] == [(0, 0), (1, b.lease_epoch)]


async def test_retried_commit_is_acknowledged_once(pool):
    (run,) = await factories.queued_runs(pool, 1)
    (held,) = await lease.claim_due(pool, ["ex-a"], 30)
    req = steps.CommitRequest(
        run.workspace_id,
        run.run_id,
        held.lease_epoch,
        [step(1)],
        steps.Transition(status="completed", text="done"),
        model_calls=1,
        tokens=10,
    )
    first = await steps.commit(pool, req, 30)
    again = await steps.commit(pool, req, 30)
    assert (first.duplicate, again.duplicate) == (False, True)
    row = await runs.get_run(pool, run.workspace_id, run.run_id)
    assert (row.status, row.output, row.model_calls, row.tokens_used) == (
        "completed",
        "done",
        1,
        10,
    )


async def test_commit_with_a_taken_seq_from_another_epoch_is_fenced(pool):
    (run,) = await factories.queued_runs(pool, 1)
    (a,) = await lease.claim_due(pool, ["ex-a"], 30)
    (b,) = await lease.claim_due(pool, ["ex-b"], 30, now=a.wake_at + timedelta(seconds=1))
    await steps.commit(
        pool,
        steps.CommitRequest(run.workspace_id, run.run_id, b.lease_epoch, [step(1)]),
        30,
    )
    with pytest.raises(Fenced):
        await steps.commit(
            pool,
            steps.CommitRequest(run.workspace_id, run.run_id, a.lease_epoch, [step(1)]),
            30,
        )


async def test_park_releases_the_lease_until_wake_time(pool):
    (run,) = await factories.queued_runs(pool, 1)
    (held,) = await lease.claim_due(pool, ["ex-a"], 30)
    park = steps.Transition(status="waiting", wait_reason="sleep", wake_after_seconds=3600)
    done = await steps.commit(
        pool,
        steps.CommitRequest(run.workspace_id, run.run_id, held.lease_epoch, [step(1)], park),
        30,
    )
    row = await runs.get_run(pool, run.workspace_id, run.run_id)
    assert (row.status, row.wait_reason, row.lease_owner) == ("waiting", "sleep", None)
    assert done.wake_at == row.wake_at
    assert await lease.claim_due(pool, ["ex-b"], 30) == []
    (woken,) = await lease.claim_due(pool, ["ex-b"], 30, now=row.wake_at)
    assert woken.attempt == 0  # a finished wait is not a takeover


async def test_a_beat_over_workspaces_answers_each_lease_by_its_position(pool):
    """An executor's beat names every run it holds, of any workspaces, in one list: each
    renewed, refused or failed lease is answered at its own position in that list (the
    statements go per workspace; the renewed come back by position, not by key)."""
    await factories.queued_runs(pool, 2, workspace_id="ws-a", deadline_seconds=60)
    await factories.queued_runs(pool, 2, workspace_id="ws-b")
    held = await lease.claim_due(pool, ["ex-a"] * 4, 30)
    a = sorted((h for h in held if h.workspace_id == "ws-a"), key=lambda h: str(h.run_id))
    b = sorted((h for h in held if h.workspace_id == "ws-b"), key=lambda h: str(h.run_id))
    # Interleaved; b[1] at a stale epoch (lost); a[1] past its deadline (failed).
    leases = [key(a[0]), key(b[0]), dataclasses.replace(key(b[1]), epoch=0), key(a[1])]
    await pool.execute("UPDATE runs SET active_seconds = 61 WHERE run_id = $1", a[1].run_id)
    beat = await lease.heartbeat_positions(
        pool,
        "ex-a",
        [k.workspace_id for k in leases],
        [k.run_id for k in leases],
        [k.epoch for k in leases],
        30,
    )
    assert set(beat.renewed) == {0, 1}
    assert beat.renewed[0] > a[0].wake_at and beat.renewed[1] > b[0].wake_at
    assert (beat.past_deadline, beat.past_max_age, beat.paused) == ({3}, set(), set())
    row = await runs.get_run(pool, "ws-b", b[1].run_id)
    assert (row.status, row.lease_epoch) == ("running", b[1].lease_epoch)  # not renewed
    await pool.execute("UPDATE runs SET paused = true WHERE run_id = $1", b[0].run_id)
    again = await lease.heartbeat_positions(
        pool,
        "ex-a",
        ["ws-b", "ws-a"],
        [b[0].run_id, a[0].run_id],
        [b[0].lease_epoch, a[0].lease_epoch],
        30,
    )
    assert (set(again.renewed), again.paused) == ({0, 1}, {0})


async def test_heartbeat_renews_only_matching_leases_and_fails_past_deadline(pool):
    r1, r2 = await factories.queued_runs(pool, 2, deadline_seconds=60)
    held = await lease.claim_due(pool, ["ex-a", "ex-a"], 30)
    assert len(held) == 2
    ok = await lease.heartbeat(pool, "ex-a", [key(h) for h in held], 30)
    assert set(ok.renewed) == {key(h) for h in held}
    assert await lease.heartbeat(pool, "ex-b", [key(held[0])], 30) == lease.HeartbeatOutcome(
        {}, set()
    )
    # Past the deadline the heartbeat is refused and the run fails with a finish step.
    # Active time: 59.5 s of earlier holds, then the current hold passes 60 s.
    await pool.execute("UPDATE runs SET active_seconds = 59.5")
    later = held[0].held_since + timedelta(seconds=1)
    out = await lease.heartbeat(pool, "ex-a", [key(h) for h in held], 30, now=later)
    assert out.renewed == {} and out.past_deadline == {key(h) for h in held}
    row = await runs.get_run(pool, r1.workspace_id, r1.run_id)
    assert (row.status, row.error) == ("failed", "deadline exceeded")
    log = await steps.list_steps(pool, r2.workspace_id, r2.run_id, 0, 10)
    assert json.loads(log[-1].payload) == {"status": "failed", "error": "deadline exceeded"}
    row = await runs.get_run(pool, r2.workspace_id, r2.run_id)
    assert row.step_count == len(log) and row.held_since is None


async def test_leases_of_several_workspaces_are_renewed_released_and_failed_alike(pool):
    """The statements over several leases name one workspace each (on Citus, one shard;
    a lock across shards is refused): the store sends one per workspace, and the outcome
    is the one a single statement gave."""
    await factories.queued_runs(pool, 2, "ws-one", deadline_seconds=60)
    await factories.queued_runs(pool, 1, "ws-two", deadline_seconds=60)
    held = await lease.claim_due(pool, ["ex-a"] * 3, 30)
    assert sorted(h.workspace_id for h in held) == ["ws-one", "ws-one", "ws-two"]
    beat = await lease.heartbeat(pool, "ex-a", [key(h) for h in held], 30)
    assert set(beat.renewed) == {key(h) for h in held}
    moved = await lease.release_on_break(pool, "ex-a", [key(h) for h in held], 2)
    assert set(moved) == {key(h) for h in held}
    await pool.execute("UPDATE runs SET active_seconds = 59.5")
    later = held[0].held_since + timedelta(seconds=1)
    out = await lease.heartbeat(pool, "ex-a", [key(h) for h in held], 30, now=later)
    assert out.renewed == {} and out.past_deadline == {key(h) for h in held}
    # The max-age sweep: workspaces first (unlocked), then a locking statement each,
    # `batch` runs in all, the longest overdue first.
    await factories.queued_runs(pool, 2, "ws-one")
    await factories.queued_runs(pool, 2, "ws-two")
    await pool.execute(
        "UPDATE runs SET max_age_seconds = 600,"
        " expires_at = now() - make_interval(secs => 30) WHERE status = 'queued'"
    )
    # One workspace per statement (a `CASE workspace_id WHEN …` over every shard is
    # deparsed by Citus into `text = boolean`).
    await pool.execute(
        "UPDATE runs SET expires_at = now() - make_interval(secs => 60)"
        " WHERE workspace_id = 'ws-two' AND status = 'queued'"
    )
    first = await lease.fail_past_max_age(pool, 3)
    assert sorted(k.workspace_id for k in first) == ["ws-one", "ws-two", "ws-two"]
    rest = await lease.fail_past_max_age(pool, 3)
    assert [k.workspace_id for k in rest] == ["ws-one"]
    assert await lease.fail_past_max_age(pool, 3) == []
    for k in first + rest:
        row = await runs.get_run(pool, k.workspace_id, k.run_id)
        assert (row.status, row.error) == ("failed", "max age exceeded")


async def test_cancel_fences_the_holder(pool):
    (run,) = await factories.queued_runs(pool, 1)
    (held,) = await lease.claim_due(pool, ["ex-a"], 30)
    cancelled = await runs.cancel_run(pool, run.workspace_id, run.run_id, "user asked")
    assert cancelled.status == "cancelled"
    with pytest.raises(Fenced):
        await steps.commit(
            pool,
            steps.CommitRequest(run.workspace_id, run.run_id, held.lease_epoch, [step(2)]),
            30,
        )
    assert (await lease.heartbeat(pool, "ex-a", [key(held)], 30)).renewed == {}
    assert await runs.cancel_run(pool, run.workspace_id, run.run_id, "again") is None


async def test_concurrent_claimers_claim_each_run_exactly_once(pool):
    # Spread over workspaces with room for all: a workspace is claimed by one
    # claimer at a time, and caps are not what this test is about.
    for w in range(8):
        await workspaces.set_plan(pool, f"ws{w}", "enterprise", 1000)
        await factories.queued_runs(pool, 50, workspace_id=f"ws{w}")
    claimed: Counter = Counter()

    async def claimer(name: str) -> None:
        # An empty claim may only mean the other claimers hold every due workspace.
        while await pool.fetchval("SELECT count(*) FROM runs WHERE status = 'queued'"):
            for r in await lease.claim_due(pool, [name] * 7, 30):
                claimed[(r.run_id, r.lease_epoch)] += 1

    await asyncio.gather(*(claimer(f"ex-{i}") for i in range(8)))
    assert len(claimed) == 400
    assert set(claimed.values()) == {1}
    owners = await pool.fetchval("SELECT count(DISTINCT lease_owner) FROM runs")
    assert owners > 1  # the claimers really ran side by side


async def test_a_value_postgres_refuses_is_a_store_error_and_nothing_is_written(pool):
    version = await factories.agent_version(pool, "ws", "nul")
    adm = runs.Admission("ws", "nul", version, "a\x00b", None, 50, 1000, 10, 60)
    with pytest.raises(DataRefused, match="run_insert"):
        await runs.insert_run(pool, adm)
    assert await pool.fetchval("SELECT count(*) FROM runs WHERE agent_id = 'nul'") == 0


async def test_an_admission_copies_its_limits_and_input_onto_the_run_and_step_0(pool):
    version = await factories.agent_version(pool, "ws", "adm")
    adm = runs.Admission(
        "ws",
        "adm",
        version,
        "hello",
        "req-1",
        7,
        8,
        9,
        10,
        model_retry_budget=11,
        max_age_seconds=12,
        started_by="key:ci",
    )
    row = await runs.insert_run(pool, adm)
    assert row.run_id == adm.run_id
    copied = (
        "max_steps",
        "max_tokens",
        "max_tool_calls",
        "deadline_seconds",
        "model_retry_budget",
        "max_age_seconds",
        "started_by",
        "input",
    )
    got = {k: getattr(row, k) for k in copied}
    assert got == {
        "max_steps": 7,
        "max_tokens": 8,
        "max_tool_calls": 9,
        "deadline_seconds": 10,
        "model_retry_budget": 11,
        "max_age_seconds": 12,
        "started_by": "key:ci",
        "input": "hello",
    }
    assert row.expires_at - row.created_at == timedelta(seconds=12)
    (first,) = await steps.list_steps(pool, "ws", row.run_id, 0, 10)
    assert (first.seq, first.kind, json.loads(first.payload)) == (
        0,
        "input",
        {"text": "hello"},
    )
    # The same request_id admits nothing.
    again = runs.Admission("ws", "adm", version, "hello", "req-1", 7, 8, 9, 10)
    assert await runs.insert_run(pool, again) is None


# Whether another backend waits for a lock that backend $1's transaction holds.
BLOCKED_BEHIND = "SELECT count(*) > 0 FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))"


@pytest.mark.plain_postgres(
    "it watches pg_blocking_pids() on the server, which on a coordinator does not see the row locks a worker holds"
)
async def test_a_heartbeat_locks_its_runs_in_key_order_so_it_waits_instead_of_deadlocking(pool):
    """A heartbeat and a grouped commit (run_commit_many) of one executor touch the same
    run rows in one statement each; the commit locks them in (workspace_id, run_id) order.
    A heartbeat that took them in the order it was sent could hold the second while
    waiting for the first, and Postgres would abort one of the two as deadlocked."""
    await factories.queued_runs(pool, 6)
    held = sorted(await lease.claim_due(pool, ["ex-a"] * 6, 30), key=lambda r: r.run_id)
    assert len(held) == 6
    lock = "SELECT 1 FROM runs WHERE run_id = $1 FOR NO KEY UPDATE"
    async with pool.acquire() as other:
        tx = other.transaction()
        await tx.start()
        await other.execute("SET LOCAL deadlock_timeout = '100ms'")
        await other.execute(lock, held[0].run_id)
        # Sent in the opposite order, the heartbeat must still wait on the first key
        # holding none of the others; so this transaction can take them all.
        beat = asyncio.create_task(
            lease.heartbeat(pool, "ex-a", [key(h) for h in reversed(held)], 30)
        )
        # Asked on a connection of the pool: inside a transaction, pg_stat_activity is a snapshot.
        await eventually(
            lambda: pool.fetchval(BLOCKED_BEHIND, other.get_server_pid()),
            timeout=5,
            message="the heartbeat waits for the held row",
        )
        assert not beat.done()
        try:
            for h in held[1:]:
                await other.execute(lock, h.run_id)
        finally:
            await tx.commit()
    out = await asyncio.wait_for(beat, 5)
    assert set(out.renewed) == {key(h) for h in held}


async def test_runs_read_by_position_are_the_runs_read_by_name(pool):
    """Run.from_records (a claim's decoder) reads each field from its position in the
    first row: with extra columns, in another order, it builds what from_record does."""
    await factories.queued_runs(pool, 3)
    rows = await pool.fetch(
        "SELECT 7 AS taken_over, r.*, 1.5::float8 AS held_seconds, true AS metered FROM runs r"
    )
    assert len(rows) == 3
    assert runs.Run.from_records(rows) == [runs.Run.from_record(r) for r in rows]
    assert runs.Run.from_records([]) == []
    short = await pool.fetch("SELECT * FROM runs")  # no held_seconds: named as from_record does
    with pytest.raises(KeyError, match="held_seconds"):
        runs.Run.from_records(short)


async def test_the_step_logs_of_a_claimed_batch_are_each_runs_own_log_in_order(pool):
    """steps_for_runs groups the rows it reads by run, every step in its run's log."""
    queued = await factories.queued_runs(pool, 3)
    held = await lease.claim_due(pool, ["ex-a"] * 3, 30)
    for n, run in enumerate(held):  # 1, 2 and 3 steps after the input
        req = steps.CommitRequest(
            run.workspace_id, run.run_id, run.lease_epoch, [step(seq) for seq in range(1, n + 2)]
        )
        await steps.commit(pool, req, 30)
    keys = [(r.workspace_id, r.run_id) for r in reversed(queued)]
    logs = await steps.steps_for_runs(pool, keys)
    assert list(logs) == [k[1] for k in keys]
    for ws, run_id in keys:
        rows = await pool.fetch(
            "SELECT * FROM steps WHERE workspace_id = $1 AND run_id = $2 ORDER BY seq", ws, run_id
        )
        assert logs[run_id] == [steps.Step.of(r) for r in rows]  # as read by name
        assert await steps.list_steps(pool, ws, run_id, 0, 100) == logs[run_id]
    assert sorted(len(log) for log in logs.values()) == [2, 3, 4]
    assert await steps.steps_for_runs(pool, []) == {}
    short = await pool.fetch("SELECT seq, kind FROM steps")
    with pytest.raises(KeyError, match="workspace_id"):
        steps.Step.of_rows(short)
