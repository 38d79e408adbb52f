"""The running counts live off the workspace row (0027_running_counts.sql): a run leaving
'running' neither waits for a claim that holds its workspace nor makes claims skip it."""

from __future__ import annotations

import asyncpg

from control_plane.store import lease, runs, workspaces
from tests import factories

# The claim's lock on its workspaces (lease.sql workspace_take_turns).
LOCK_AS_A_CLAIM = "SELECT 1 FROM workspaces WHERE workspace_id = 'ws' FOR NO KEY UPDATE"
COUNTS = """
SELECT workspace_running('ws') AS ws, agent_running('ws', 'agent') AS agent,
       (SELECT count(*) FROM runs WHERE status = 'running') AS actual
"""


async def test_finishing_neither_waits_for_a_claim_nor_makes_claims_skip_the_workspace(pool):
    await workspaces.set_plan(pool, "ws", "team")
    await factories.queued_runs(pool, 6)
    held = await lease.claim_due(pool, ["ex"] * 4, 30)
    async with pool.acquire() as claimer, pool.acquire() as finisher:
        # A claim holds the workspace: a cancel (out of 'running') goes through at once.
        async with claimer.transaction():
            await claimer.execute(LOCK_AS_A_CLAIM)
            await finisher.execute("SET lock_timeout = '2s'")
            await runs.cancel_run(finisher, "ws", held[0].run_id, "stop")
        # A finish in flight: a claim still takes the workspace's due runs.
        async with finisher.transaction():
            await finisher.execute("DELETE FROM steps WHERE run_id = $1", held[1].run_id)
            await finisher.execute("DELETE FROM runs WHERE run_id = $1", held[1].run_id)
            assert len(await lease.claim_due(claimer, ["ex"] * 2, 30)) == 2
        await finisher.execute("RESET lock_timeout")
    counts = await pool.fetchrow(COUNTS)
    assert (counts["ws"], counts["agent"], counts["actual"]) == (4, 4, 4)
    assert (await workspaces.get(pool, "ws"))["running"] == 4


EVERY_COUNT = """
SELECT (SELECT coalesce(sum(n), 0) FROM workspace_running_counts WHERE workspace_id = r.ws)
           AS counted,
       (SELECT count(*) FROM runs WHERE workspace_id = r.ws AND status = 'running') AS actual,
       r.ws
FROM (SELECT DISTINCT workspace_id AS ws FROM runs) r
UNION ALL
SELECT (SELECT coalesce(sum(n), 0) FROM agent_running_counts
        WHERE workspace_id = a.workspace_id AND agent_id = a.agent_id),
       (SELECT count(*) FROM runs
        WHERE workspace_id = a.workspace_id AND agent_id = a.agent_id AND status = 'running'),
       a.workspace_id || '/' || a.agent_id
FROM agents a
"""
# The lease step alone, as the claim runs it on one shard (0047): it counts its own runs.
SHARD_CLAIM = """SELECT * FROM agentrun_claim_shard($1, 30, NULL, ARRAY['ws', 'ws2'],
                                                 NULL, NULL, NULL, 0, false)
                 WHERE served IS NULL"""


async def assert_counts_exact(pool: asyncpg.pool.Pool) -> None:
    rows = await pool.fetch(EVERY_COUNT)
    assert rows and all(r["counted"] == r["actual"] for r in rows), [dict(r) for r in rows]


async def test_a_claim_counts_its_runs_by_agent_and_takeovers_not_at_all(pool):
    """agentrun_claim() adds its fresh runs once per workspace and agent (0030): the counts
    stay exact through batches over several agents, takeovers, finishes and a direct call of
    the lease step of one shard (0047), which counts its own runs."""
    for ws in ("ws", "ws2"):
        await workspaces.set_plan(pool, ws, "team")
        for agent in ("a1", "a2"):
            await factories.queued_runs(pool, 5, workspace_id=ws, agent_id=agent)
    held = await lease.claim_due(pool, ["ex"] * 7, 30)
    assert len(held) == 7
    await assert_counts_exact(pool)
    # Three leases lapse; the next claim takes them over (still 'running') and fresh ones.
    lapsed = [r.run_id for r in held[:3]]
    await pool.execute(
        "UPDATE runs SET wake_at = now() - interval '1 second' WHERE run_id = ANY($1)", lapsed
    )
    again = await lease.claim_due(pool, ["ex"] * 6, 30)
    assert {r.run_id for r in again} >= set(lapsed) and len(again) == 6
    await assert_counts_exact(pool)
    await runs.cancel_run(pool, held[4].workspace_id, held[4].run_id, "stop")
    await assert_counts_exact(pool)
    # The lease step called alone counts what it leases too.
    assert len(await pool.fetch(SHARD_CLAIM, ["ex"] * 4)) == 4
    await assert_counts_exact(pool)
    assert await pool.fetchval("SELECT count(*) FROM runs WHERE status = 'running'") == 13
