"""The claim per shard (migrations/0047_claim_per_shard.sql) on plain PostgreSQL.

Turns are taken in workspace_turns, the lease step runs once per shard holding one of them
(agentrun_shard_of), and the turns are marked and raised afterwards. Plain PostgreSQL is one
shard; here agentrun_shard_of is replaced to split the workspaces over two, and the lowering
Citus uses (writes to workspace_wakes beside the runs, folded by each claim) is installed, so
that CI runs the code paths a cluster runs.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from control_plane.store import citus, lease, workspaces
from control_plane.store.queries import run
from tests import factories

# It fakes two shards on one server (agentrun_shard_of replaced): on a cluster that groups
# workspaces of different real shards into one lease step, which Citus refuses.
pytestmark = pytest.mark.plain_postgres(
    "it fakes two shards by replacing agentrun_shard_of; on a cluster the real shards "
    "are covered by test_citus_statements.py and the suite's claims"
)

TWO_SHARDS = """
CREATE OR REPLACE FUNCTION agentrun_shard_of(ws text) RETURNS bigint
LANGUAGE sql STABLE AS $$ SELECT CASE WHEN ws IN ('a1', 'a2') THEN 1 ELSE 2 END::bigint $$
"""


async def claim(pool, n: int) -> list:
    return await lease.claim_due(pool, ["ex"] * n, 30)


async def turn(pool, ws: str) -> asyncpg.Record | None:
    return await pool.fetchrow(
        "SELECT next_wake_at, last_served_at FROM workspace_turns WHERE workspace_id = $1", ws
    )


async def test_a_batch_is_shared_between_shards_in_turn_order_within_every_cap(pool):
    await pool.execute(TWO_SHARDS)
    for ws in ("a1", "a2", "b1", "b2"):
        await workspaces.set_plan(pool, ws, "enterprise", 3)
        await factories.queued_runs(pool, 5, workspace_id=ws)
    first = await claim(pool, 4)
    # One run from each workspace, two shards' lease steps in one claim.
    assert Counter(r.workspace_id for r in first) == {"a1": 1, "a2": 1, "b1": 1, "b2": 1}
    everything = [r for _ in range(6) for r in await claim(pool, 4)]
    running = Counter(r.workspace_id for r in first + everything)
    # Each workspace's cap of 3 held on both shards; nothing claimed twice.
    assert running == {"a1": 3, "a2": 3, "b1": 3, "b2": 3}
    assert len({r.run_id for r in first + everything}) == 12
    counted = await pool.fetch(
        "SELECT workspace_id, sum(n) AS n FROM workspace_running_counts GROUP BY 1"
    )
    assert {r["workspace_id"]: r["n"] for r in counted} == dict(running)


async def test_wakes_lowered_on_a_shard_are_folded_into_the_turns_by_the_claim(pool):
    """Citus's lowering (citus.LOWER_NEXT_WAKE): admissions write workspace_wakes, not
    workspace_turns; the next claim folds the due ones, takes the runs and deletes what it
    folded; a wake not yet due stays until it is."""
    await pool.execute(citus.LOWER_NEXT_WAKE)
    await pool.execute(TWO_SHARDS)
    await factories.queued_runs(pool, 2, workspace_id="a1")
    await factories.queued_runs(pool, 1, workspace_id="b1")
    assert await turn(pool, "a1") is None
    assert await pool.fetchval("SELECT count(*) FROM workspace_wakes") == 2
    got = await claim(pool, 8)
    assert Counter(r.workspace_id for r in got) == {"a1": 2, "b1": 1}
    assert await pool.fetchval("SELECT count(*) FROM workspace_wakes") == 0
    # Emptied: raised to the first lease end (a lapsed lease is due then).
    assert (await turn(pool, "a1"))["next_wake_at"] == min(
        r.wake_at for r in got if r.workspace_id == "a1"
    )
    # A run due later (a retry's backoff): the claim folds its admission's wake, finds
    # nothing due, and raises the turn to the run's wake.
    (parked,) = await factories.queued_runs(pool, 1, workspace_id="b2")
    later = "UPDATE runs SET wake_at = now() + $2::interval WHERE run_id = $1"
    await pool.execute(later, parked.run_id, timedelta(hours=1))
    assert await claim(pool, 8) == []
    assert await pool.fetchval("SELECT count(*) FROM workspace_wakes") == 0
    assert (await turn(pool, "b2"))["next_wake_at"] > datetime.now(UTC)
    # A wake not yet due waits beside the runs; once lowered to now it is folded.
    await pool.execute(later, parked.run_id, timedelta(minutes=30))
    assert await claim(pool, 8) == []
    assert await pool.fetchval("SELECT count(*) FROM workspace_wakes") == 1
    await pool.execute("UPDATE runs SET wake_at = now() WHERE run_id = $1", parked.run_id)
    (woken,) = await claim(pool, 8)
    assert woken.run_id == parked.run_id


async def test_a_lease_cut_short_is_taken_over_at_its_workspaces_turn(pool):
    """Lapsed leases are taken over by the lease step of their workspace's turn: a lease
    whose wake_at moves earlier (a release on break) lowers next_wake_at, even when the
    workspace has nothing else due."""
    await factories.queued_runs(pool, 1)
    (held,) = await claim(pool, 1)
    assert (await turn(pool, "ws"))["next_wake_at"] == held.wake_at
    assert await claim(pool, 1) == []
    await pool.execute(
        "UPDATE runs SET wake_at = now() - interval '1 second' WHERE run_id = $1", held.run_id
    )
    (again,) = await claim(pool, 1)
    assert again.run_id == held.run_id and again.lease_epoch == held.lease_epoch + 1


async def test_a_paused_queue_spends_no_turns_until_it_is_resumed(pool):
    await factories.queued_runs(pool, 2, workspace_id="paused")
    await factories.queued_runs(pool, 1, workspace_id="open")
    await pool.execute("UPDATE workspaces SET queue_paused = true WHERE workspace_id = 'paused'")
    (got,) = await claim(pool, 4)
    assert got.workspace_id == "open"
    # Raised past its queued runs: nothing running, so nothing due at all.
    assert (await turn(pool, "paused"))["next_wake_at"] is None
    # Resumed by the statement SetQueuePaused runs: next_wake_at lowered again.
    resumed = await run(pool, "workspace_set_queue_paused", "paused", False)
    assert resumed["found"] == 1 and resumed["first_wake"] is not None
    await run(pool, "workspace_lower_wake", "paused", resumed["first_wake"])
    assert Counter(r.workspace_id for r in await claim(pool, 4)) == {"paused": 2}


async def test_a_workspace_at_its_cap_takes_its_turn_and_the_next_round_serves_the_line(pool):
    """The coordinator does not know the caps: a turn taken by a workspace at its cap is spent
    (to the back of the line) and a one-run claim takes the next turn in another round."""
    await workspaces.set_plan(pool, "full", "enterprise", 1)
    await factories.queued_runs(pool, 3, workspace_id="full")
    (first,) = await claim(pool, 1)
    assert first.workspace_id == "full"
    await factories.queued_runs(pool, 1, workspace_id="other")
    await pool.execute(
        "UPDATE workspace_turns SET last_served_at = '-infinity' WHERE workspace_id = 'full'"
    )
    (second,) = await claim(pool, 1)
    assert second.workspace_id == "other"
