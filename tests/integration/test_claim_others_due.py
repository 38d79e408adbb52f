"""A claim that passed over a workspace another claimer held says so (others_due,
migrations/0031_claim_others_due.sql), and the dispatcher then claims again in
milliseconds instead of waiting for its poll (real Postgres; a real control plane and
executor for the last test)."""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager

import asyncpg

from control_plane.store import lease
from tests import factories
from tests.harness.agentrun_api import Api
from tests.harness.waiting import eventually
from tests.integration.test_takeover import logged


@asynccontextmanager
async def held(db_url: str, workspace_id: str):
    """The workspace's row locked as a claim's first step locks it, by another transaction."""
    conn = await asyncpg.connect(db_url)
    tx = conn.transaction()
    await tx.start()
    await conn.execute(
        "SELECT 1 FROM workspaces WHERE workspace_id = $1 FOR NO KEY UPDATE", workspace_id
    )
    try:
        yield
    finally:
        await tx.rollback()
        await conn.close()


async def test_a_claim_that_passed_over_a_held_workspace_says_others_are_due(pool, db_url):
    (run,) = await factories.queued_runs(pool, 1, workspace_id="ws-held")
    (free,) = await factories.queued_runs(pool, 1, workspace_id="ws-free")
    async with held(db_url, "ws-held"):
        got = await lease.claim_due(pool, ["ex", "ex"], 30)
        # The free workspace's run is taken; the held one's is left, and said to be due.
        assert [r.run_id for r in got] == [free.run_id]
        assert got.others_due
        # A claim that takes nothing says it too.
        nothing = await lease.claim_due(pool, ["ex"], 30)
        assert nothing == [] and nothing.others_due
    after = await lease.claim_due(pool, ["ex", "ex"], 30)
    assert [r.run_id for r in after] == [run.run_id]
    assert not after.others_due  # nothing left anywhere
    idle = await lease.claim_due(pool, ["ex"], 30)
    assert idle == [] and not idle.others_due


async def test_a_full_claim_or_runs_the_owners_cannot_take_never_say_others_are_due(pool, db_url):
    # Three workspaces whose runs need tools these owners do not carry, one slot: every
    # claim serves the workspace whose turn it takes, and none is passed over as held.
    for ws in ("ws-a", "ws-b", "ws-c"):
        await factories.queued_runs(pool, 1, workspace_id=ws)
    for _ in range(4):
        got = await lease.claim_due(pool, ["ex"], 30, carried=["echo"])
        assert got == [] and not got.others_due
    # A held workspace passed over by a claim that filled its batch asks for nothing more.
    async with held(db_url, "ws-a"):
        got = await lease.claim_due(pool, ["ex"], 30)
        assert len(got) == 1 and not got.others_due


async def test_the_dispatcher_claims_a_held_workspace_soon_after_it_is_let_go(
    db_url, control_plane, executor_factory, sandbox_model, sandbox_providers, db
):
    # A poll long enough that only others_due can explain a prompt claim.
    cp = control_plane(db_url, AGENTRUN_CLAIM_POLL_SECONDS="60")
    api = await Api.connect(cp.address, db_url)
    try:
        await api.publish("writer", "writer", ["crm_lookup", "send_email", "echo", "sleep"])
        run_id = await api.start("writer")
        async with held(db_url, api.ws):
            # The executor's connection wakes the dispatcher: its claim passes over the
            # held workspace, so it claims again, at growing pauses, while it is held.
            (executor,) = executor_factory(cp)
            await eventually(
                lambda: logged(executor, "connected to control plane"),
                timeout=30,
                message="the executor never connected",
            )
            await asyncio.sleep(1.0)  # held a while: the pauses reach their longest
            assert await _epoch(db, run_id) == 0  # never claimed while it is held
            let_go = time.monotonic()
        await eventually(
            lambda: _claimed(db, run_id),
            timeout=10,
            message="not claimed within 10 s of its workspace being let go",
        )
        assert time.monotonic() - let_go < 5, "claimed only at the poll"
    finally:
        await api.close()


async def _epoch(db, run_id: str) -> int:
    return await db.fetchval("SELECT lease_epoch FROM runs WHERE run_id = $1", run_id)


async def _claimed(db, run_id: str) -> bool:
    return await _epoch(db, run_id) > 0
