"""A run claimed for a stream that ends before its Assignment goes out is handed back at
once: never recorded on the ended stream, whose break released what it held before."""

from __future__ import annotations

from control_plane.dispatch.dispatcher import Dispatcher
from control_plane.dispatch.session import ExecutorSession
from control_plane.ground.config import ServerConfig
from control_plane.store import lease, runs, steps
from tests import factories


async def test_a_run_whose_stream_ended_before_delivery_is_runnable_again_at_once(pool):
    await factories.queued_runs(pool, 1)
    dispatcher = Dispatcher(pool, ServerConfig(database_url=""))
    session = ExecutorSession(dispatcher)
    session.executor_id, session.slots.credits = "ex-a", 1
    dispatcher.register(session)
    (run,) = await lease.claim_due(pool, ["ex-a"], 30)
    log = await steps.list_steps(pool, run.workspace_id, run.run_id, 0, 10)

    # The stream ends while the run is on its way: its break releases what it holds now,
    # which is nothing yet. The Assignment must not go out, nor the run be recorded on it.
    dispatcher.unregister(session)
    assert not await dispatcher.assign(session, run, log)
    assert run.run_id not in session.slots.held and session._out.empty()

    row = await runs.get_run(pool, run.workspace_id, run.run_id)
    assert row is not None
    assert (row.status, row.wait_reason, row.lease_owner) == ("waiting", "handoff", None)
    # Claimable now, not once its 30-second lease would have lapsed.
    (again,) = await lease.claim_due(pool, ["ex-b"], 30)
    assert (again.run_id, again.lease_epoch) == (run.run_id, run.lease_epoch + 1)
