"""The running counts live off the workspace row (0027_running_counts.sql): a run leaving
'running' neither waits for a claim that holds its workspace nor makes claims skip it."""

from __future__ import annotations

import asyncpg
import pytest

from control_plane.store import lease, runs, workspaces
from tests import factories

# The claim's lock on its workspaces (lease.sql workspace_take_turns).
LOCK_AS_A_CLAIM = "SELECT 1 FROM workspaces WHERE workspace_id = 'ws' FOR NO KEY UPDATE"
COUNTS = """
SELECT workspace_running('ws') AS ws, agent_running('ws', 'agent') AS agent,
       (SELECT count(*) FROM runs WHERE status = 'running') AS actual
"""


@pytest.fixture
async def pool(db_url):
    p = await asyncpg.create_pool(db_url, min_size=1, max_size=4)
    yield p
    await p.close()


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
