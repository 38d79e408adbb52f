"""Approvals close with their run (issue 43): cancel or max age closes them in the same transaction."""

from __future__ import annotations

import grpc
import pytest

from agentrun.v1 import approval_pb2, approval_pb2_grpc
from control_plane.server import start
from control_plane.store import lease, runs
from control_plane.store.queries import run as run_query
from tests.harness import auth
from tests.harness.approval_routes import (  # noqa: F401 (fixtures)
    config_fixture,
    http_fixture,
    pool_fixture,
)
from tests.integration.test_approvals import hold


async def pending(pool) -> int:
    rows = await run_query(pool, "metrics_approvals_pending")
    return sum(r["pending"] for r in rows)


async def test_cancel_closes_the_approval_at_once_and_a_decision_is_refused_naming_it(
    pool, config, db_url
):
    run_id, approval_id = await hold(pool)
    other_run, other_approval = await hold(pool)
    assert await pending(pool) == 2

    assert await runs.cancel_run(pool, "ws", run_id, "changed my mind") is not None
    # In the cancel's own transaction: no loop had to run for any of this.
    row = await pool.fetchrow("SELECT * FROM approvals WHERE approval_id = $1", approval_id)
    assert (row["decision"], row["decided_by"], row["reason"]) == (
        "closed",
        "system:run",
        "run cancelled: changed my mind",
    )
    assert await pending(pool) == 1  # the metric's query

    server = await start(config)
    key = await auth.workspace_key(db_url, "ws", role="approver", principal="alice@example.com")
    channel = auth.channel(f"127.0.0.1:{server.port}", key)
    try:
        stub = approval_pb2_grpc.ApprovalServiceStub(channel)
        # The inbox (CLI and console read this list) shows only the other run's approval.
        listed = await stub.ListApprovals(
            approval_pb2.ListApprovalsRequest(state=approval_pb2.APPROVAL_STATE_PENDING)
        )
        assert [a.approval_id for a in listed.approvals] == [str(other_approval)]
        closed = await stub.ListApprovals(
            approval_pb2.ListApprovalsRequest(state=approval_pb2.APPROVAL_STATE_CLOSED)
        )
        assert [(a.approval_id, a.reason) for a in closed.approvals] == [
            (str(approval_id), "run cancelled: changed my mind")
        ]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.DecideApproval(
                approval_pb2.DecideApprovalRequest(
                    approval_id=str(approval_id),
                    approver="alice@example.com",
                    approve=approval_pb2.Approve(),
                )
            )
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "closed" in info.value.details()
        assert "run cancelled: changed my mind" in info.value.details()
        # The other run's approval is untouched and still decides.
        ok = await stub.DecideApproval(
            approval_pb2.DecideApprovalRequest(
                approval_id=str(other_approval),
                approver="alice@example.com",
                approve=approval_pb2.Approve(),
            )
        )
        assert ok.approval.state == approval_pb2.APPROVAL_STATE_APPROVED
        assert (await runs.get_run(pool, "ws", other_run)).status == "waiting"
    finally:
        await channel.close()
        await server.stop(grace=0)


async def test_max_age_closes_the_approval_of_a_run_that_waited_too_long(pool):
    run_id, approval_id = await hold(pool)
    await pool.execute(
        "UPDATE runs SET max_age_seconds = 60, expires_at = now() - interval '1 second'"
        " WHERE run_id = $1",
        run_id,
    )
    failed = await lease.fail_past_max_age(pool, 10)
    assert [k.run_id for k in failed] == [run_id]
    row = await pool.fetchrow("SELECT * FROM approvals WHERE approval_id = $1", approval_id)
    assert (row["decision"], row["reason"]) == ("closed", "run failed: max age exceeded")
    finished = await pool.fetchval("SELECT finished_at FROM runs WHERE run_id = $1", run_id)
    assert row["decided_at"] == finished
    assert await pending(pool) == 0
