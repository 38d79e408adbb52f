"""The fair claim against real Postgres: turn order, caps, lapsed leases, counters, positions."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from datetime import UTC, datetime, timedelta

import asyncpg

from control_plane.store import lease, runs, steps, workspaces
from tests import factories


async def claim(pool, n: int, **kw) -> list[asyncpg.Record]:
    return await lease.claim_due(pool, ["ex"] * n, 30, **kw)


async def finish(pool, row, status: str = "completed", seq: int = 1) -> None:
    """Commit a transition for a claimed run (default: complete it)."""
    if status == "completed":
        transition = steps.Transition(status="completed", text="done")
    else:
        transition = steps.Transition(status="waiting", wait_reason="sleep", wake_after_seconds=0)
    payload = json.dumps({"content": "x", "tool_calls": []})
    step = steps.NewStep(seq, "model_decision", None, payload)
    req = steps.CommitRequest(row.workspace_id, row.run_id, row.lease_epoch, [step], transition)
    await steps.commit(pool, req, 30)


async def next_wake(pool, ws: str = "ws") -> datetime | None:
    """The workspace's next_wake_at in the claim's line (workspace_turns, 0047)."""
    return await pool.fetchval(
        "SELECT next_wake_at FROM workspace_turns WHERE workspace_id = $1", ws
    )


async def counters_match(pool) -> None:
    """The maintained running counts equal the runs actually running."""
    bad = await pool.fetch("""
        SELECT w.workspace_id, (SELECT coalesce(sum(c.n), 0) FROM workspace_running_counts c
        WHERE c.workspace_id = w.workspace_id) AS running,
               (SELECT count(*) FROM runs r
                WHERE r.workspace_id = w.workspace_id AND r.status = 'running') AS actual
        FROM workspaces w
        UNION ALL
        SELECT a.workspace_id || '/' || a.agent_id,
               (SELECT coalesce(sum(c.n), 0) FROM agent_running_counts c
        WHERE c.workspace_id = a.workspace_id AND c.agent_id = a.agent_id) AS running,
               (SELECT count(*) FROM runs r WHERE r.workspace_id = a.workspace_id
                AND r.agent_id = a.agent_id AND r.status = 'running')
        FROM agents a
    """)
    assert [tuple(r) for r in bad if r["running"] != r["actual"]] == []


async def test_a_small_workspace_is_served_between_a_big_ones_runs(pool):
    await factories.queued_runs(pool, 10, workspace_id="big")
    await factories.queued_runs(pool, 2, workspace_id="small")  # admitted after all of big's
    order = [(await claim(pool, 1))[0].workspace_id for _ in range(5)]
    # FIFO would give big five times; the least recently served goes first.
    assert order == ["big", "small", "big", "small", "big"]


async def test_a_batch_goes_round_robin_across_workspaces(pool):
    await factories.queued_runs(pool, 5, workspace_id="a")
    await factories.queued_runs(pool, 1, workspace_id="b")
    await factories.queued_runs(pool, 2, workspace_id="c")
    got = Counter(r.workspace_id for r in await claim(pool, 6))
    assert got == {"a": 3, "b": 1, "c": 2}


async def test_a_workspace_with_more_than_its_share_fills_the_rest_of_the_batch(pool):
    """The claim first reads each workspace's share of the batch (6 over 3: two, and one
    more); b and c have less, so the round robin needs a's fourth run: read again."""
    await factories.queued_runs(pool, 10, workspace_id="a")
    await factories.queued_runs(pool, 1, workspace_id="b")
    await factories.queued_runs(pool, 1, workspace_id="c")
    got = Counter(r.workspace_id for r in await claim(pool, 6))
    assert got == {"a": 4, "b": 1, "c": 1}


async def test_oldest_due_run_of_the_workspace_first_and_parked_runs_wait(pool):
    early, late = await factories.queued_runs(pool, 2)
    await pool.execute(
        "UPDATE runs SET status = 'waiting', wait_reason = 'sleep', "
        "wake_at = now() + interval '1 hour' WHERE run_id = $1",
        early.run_id,
    )
    (first,) = await lease.claim_due(pool, ["ex"], 4 * 3600)  # held past the wake time
    assert first.run_id == late.run_id
    assert await claim(pool, 1) == []
    (woken,) = await claim(pool, 1, now=first.started_at + timedelta(hours=2))
    assert woken.run_id == early.run_id


async def test_the_workspace_cap_holds_and_frees_on_completion(pool):
    await workspaces.set_plan(pool, "ws", "free")  # 2 at once
    await factories.queued_runs(pool, 5)
    held = await claim(pool, 10)
    assert len(held) == 2
    assert await claim(pool, 10) == []
    await finish(pool, held[0])
    assert len(await claim(pool, 10)) == 1
    await counters_match(pool)


async def test_an_agent_cap_leaves_room_for_the_workspaces_other_agents(pool):
    await factories.queued_runs(pool, 5, agent_id="noisy")
    await factories.queued_runs(pool, 3, agent_id="quiet")
    await workspaces.set_agent_cap(pool, "ws", "noisy", 1)
    got = Counter(r.agent_id for r in await claim(pool, 10))
    assert got == {"noisy": 1, "quiet": 3}
    await counters_match(pool)


async def test_publishing_a_spec_with_max_concurrency_caps_the_agent(pool):
    spec = {**factories.DEFAULT_SPEC, "max_concurrency": 2}
    await factories.agent_version(pool, "ws", "capped", spec)
    row = await pool.fetchrow("SELECT max_concurrency FROM agents WHERE agent_id = 'capped'")
    assert row["max_concurrency"] == 2


async def test_lapsed_leases_are_taken_over_even_at_the_cap(pool):
    await workspaces.set_plan(pool, "ws", "free")
    await factories.queued_runs(pool, 3)
    held = await claim(pool, 5)
    later = held[0].wake_at + timedelta(seconds=1)
    taken = await claim(pool, 5, now=later)
    assert {r.run_id for r in taken} == {r.run_id for r in held}
    assert {r.attempt for r in taken} == {1}
    ws = await workspaces.get(pool, "ws")
    assert ws["running"] == 2  # the takeover kept the slots it had


async def test_counters_follow_every_way_in_and_out_of_running(pool):
    rows = await factories.queued_runs(pool, 6, deadline_seconds=3600)
    held = await claim(pool, 6)
    await finish(pool, held[0])  # completed
    await finish(pool, held[1], status="waiting")  # parked
    await runs.cancel_run(pool, "ws", held[2].run_id, "stop")
    await lease.release_unassigned(pool, lease.LeaseKey("ws", held[3].run_id, held[3].lease_epoch))
    await pool.execute(
        "UPDATE runs SET active_seconds = deadline_seconds WHERE run_id = $1", held[4].run_id
    )
    await lease.heartbeat(
        pool, "ex", [lease.LeaseKey("ws", held[4].run_id, held[4].lease_epoch)], 30
    )
    await counters_match(pool)
    assert (await workspaces.get(pool, "ws"))["running"] == 1
    await pool.execute("DELETE FROM steps WHERE run_id = $1", held[5].run_id)
    await pool.execute("DELETE FROM runs WHERE run_id = $1", held[5].run_id)
    await counters_match(pool)
    await pool.execute("TRUNCATE runs CASCADE")
    assert await next_wake(pool) is None
    await counters_match(pool)
    assert len(rows) == 6


async def test_next_wake_at_tracks_the_earliest_waiting_run(pool):
    (row,) = await factories.queued_runs(pool, 1)
    (held,) = await claim(pool, 1)
    # Claimed the only due run: nothing is due before its lease ends (a lapsed lease is
    # taken over at its workspace's turn).
    assert await next_wake(pool) == held.wake_at
    park = steps.Transition(status="waiting", wait_reason="approval")  # event wait: no wake time
    step = steps.NewStep(1, "park", None, json.dumps({"wait_reason": "approval"}))
    await steps.commit(
        pool, steps.CommitRequest("ws", row.run_id, held.lease_epoch, [step], park), 30
    )
    # Parked on an event: nothing due; the old lease's end is still a lower bound.
    assert await next_wake(pool) == held.wake_at
    assert await claim(pool, 1) == []
    # The event sets wake_at to now: the workspace is due again.
    await pool.execute("UPDATE runs SET wake_at = now() WHERE run_id = $1", row.run_id)
    assert await next_wake(pool) <= datetime.now(UTC)
    (again,) = await claim(pool, 1)
    assert again.run_id == row.run_id


async def test_next_wake_at_is_raised_only_where_the_claim_may_have_emptied_the_workspace(pool):
    """A workspace that filled its room, or kept a due run the claim read and left, keeps its
    next_wake_at (any lower bound is safe); one that got less than its room and kept none is
    raised to its earliest waiting run or lease end (here the lease it just took)."""
    await workspaces.set_plan(pool, "full", "enterprise", 1)
    await factories.queued_runs(pool, 2, workspace_id="full")
    await factories.queued_runs(pool, 3, workspace_id="kept")
    await factories.queued_runs(pool, 1, workspace_id="emptied")
    mark = "UPDATE workspace_turns SET next_wake_at = '2000-01-01', last_served_at = $2 WHERE workspace_id = $1"
    for i, ws in enumerate(("full", "kept", "emptied")):
        await pool.execute(mark, ws, datetime(2000, 1, 1, tzinfo=UTC) + timedelta(seconds=i))
    claimed = await claim(pool, 3)
    got = Counter(r.workspace_id for r in claimed)
    assert got == {"full": 1, "kept": 1, "emptied": 1}
    wakes = {
        r["workspace_id"]: r["next_wake_at"]
        for r in await pool.fetch("SELECT workspace_id, next_wake_at FROM workspace_turns")
    }
    old = datetime(2000, 1, 1, tzinfo=UTC)
    (lease_end,) = [r.wake_at for r in claimed if r.workspace_id == "emptied"]
    assert (wakes["full"], wakes["kept"], wakes["emptied"]) == (old, old, lease_end)


async def test_queue_position_counts_runs_ahead_and_names_the_cap(pool):
    await workspaces.set_plan(pool, "ws", "free")
    queued = await factories.queued_runs(pool, 5, agent_id="noisy")
    await claim(pool, 2)
    waiting = [r for r in queued if (await runs.get_run(pool, "ws", r.run_id)).status == "queued"]
    positions = [await lease.queue_position(pool, "ws", r.run_id) for r in waiting]
    assert sorted(p.runs_ahead for p in positions) == [0, 1, 2]
    assert all(p.due and p.workspace_full and not p.agent_full for p in positions)

    await workspaces.set_plan(pool, "ws", "team")
    await workspaces.set_agent_cap(pool, "ws", "noisy", 2)
    await factories.queued_runs(pool, 1, agent_id="quiet")  # newest, but its agent has room
    pos = await lease.queue_position(pool, "ws", waiting[0].run_id)
    assert pos.agent_full and not pos.workspace_full
    running = await pool.fetchval("SELECT run_id FROM runs WHERE status = 'running' LIMIT 1")
    assert await lease.queue_position(pool, "ws", running) is None


async def test_a_workspace_in_another_claim_is_skipped_not_shared(pool):
    """The row lock is what keeps two claimers from both filling one workspace's room."""
    await workspaces.set_plan(pool, "ws", "enterprise", 3)
    await factories.queued_runs(pool, 3)
    async with pool.acquire() as a, a.transaction():
        assert len(await lease.claim_due(a, ["a"], 30)) == 1  # still open: room looks like 3
        # Skipped at once: another claimer neither waits for the lock nor shares the room.
        assert await asyncio.wait_for(claim(pool, 3), timeout=5) == []
    assert len(await claim(pool, 3)) == 2
    assert (await workspaces.get(pool, "ws"))["running"] == 3


async def test_a_claim_never_hides_a_run_being_admitted(pool):
    """No lost wake-up: emptying a workspace while an admission is in flight keeps it due."""
    (first,) = await factories.queued_runs(pool, 1)
    version = first.agent_version
    async with pool.acquire() as admitting, admitting.transaction():
        adm = runs.Admission("ws", "agent", version, "late", None, 50, 100_000, 100, 3600)
        late = await runs.insert_run(admitting, adm)
        (taken,) = await claim(pool, 5)  # the only committed run: the workspace looks empty
        assert taken.run_id == first.run_id
    (again,) = await claim(pool, 5)
    assert again.run_id == late.run_id
