"""Kill -9 at every point of the approval transaction and the relay: nothing lost, nothing twice."""

from __future__ import annotations

import grpc
import pytest

from agentrun.v1 import approval_pb2, approval_pb2_grpc, run_pb2
from tests.harness.agentrun_api import Api, sandbox_requests
from tests.harness.auth import workspace_key
from tests.harness.waiting import eventually

APPROVER = "manager@example.com"


async def publish(api: Api) -> None:
    policy = approval_pb2.ApprovalPolicy(tools=["send_email"], approvers=[APPROVER])
    await api.publish("mailer", "approval", ["send_email"], approval=policy)


async def approvals_of(db, run_id: str) -> list:
    return await db.fetch("SELECT * FROM approvals WHERE run_id = $1", run_id)


async def check_consistent(db, run_id: str) -> None:
    """Every approval has its recorded step, its notifications delivered, one decision at most."""
    for a in await approvals_of(db, run_id):
        step = await db.fetchval(
            "SELECT count(*) FROM steps WHERE run_id = $1 AND kind = 'approval_requested'"
            " AND payload->>'approval_id' = $2",
            run_id,
            str(a["approval_id"]),
        )
        assert step == 1, f"approval {a['approval_id']} without its recorded step"
        decided = await db.fetchval(
            "SELECT count(*) FROM steps WHERE run_id = $1 AND kind = 'approval_decided'"
            " AND payload->>'approval_id' = $2",
            run_id,
            str(a["approval_id"]),
        )
        assert decided == (1 if a["decision"] else 0)

    async def delivered() -> bool:
        left = await db.fetchval("SELECT count(*) FROM outbox WHERE delivered_at IS NULL")
        return left == 0

    await eventually(delivered, timeout=30, message="a notification was never delivered")


async def wait_pending(stub, run_id: str) -> approval_pb2.Approval:
    async def one():
        resp = await stub.ListApprovals(
            approval_pb2.ListApprovalsRequest(
                workspace_id="ws", state=approval_pb2.APPROVAL_STATE_PENDING
            )
        )
        mine = [a for a in resp.approvals if a.run_id == run_id]
        return mine[0] if mine else None

    return await eventually(one, timeout=30, message="no pending approval")


async def approve(stub, approval_id: str):
    """Approve as the approver whose key `stub` calls with (the request names nobody)."""
    return await stub.DecideApproval(
        approval_pb2.DecideApprovalRequest(
            workspace_id="ws", approval_id=approval_id, approve=approval_pb2.Approve()
        )
    )


@pytest.mark.parametrize(
    ("where", "fault"),
    [
        ("executor", "executor.decision.after_commit=kill@1"),  # decision in, hold not yet
        ("control_plane", "control_plane.commit.before_reply=kill@2"),  # hold in, reply lost
        ("control_plane", "control_plane.relay.after_send=kill@1"),  # posted, not marked
        ("control_plane", "control_plane.approval.before_commit=kill@1"),  # decision rolled back
    ],
)
async def test_a_crash_anywhere_leaves_one_approval_delivered_and_decided_once(
    db_url, db, control_plane, executor_factory, sandbox_providers, where, fault
):
    # A control-plane point counts every commit, assignment and send: with the release gate
    # on, the self-check canary's would take the hits this test aims at the approval's.
    armed = {"AGENTRUN_FAULTS": fault, "AGENTRUN_RELEASE_GATE": "off"}
    cp = control_plane(db_url, **(armed if where == "control_plane" else {}))
    api = await Api.connect(cp.address, db_url)
    key = await workspace_key(db_url, "ws", role="approver", principal=APPROVER)
    approver = Api(cp.address, "ws", key)  # the approver's own key decides (an ordinary tool)
    stub = approval_pb2_grpc.ApprovalServiceStub(approver.channel)
    try:
        await publish(api)
        run_id = await api.start("mailer", "email ada")
        doomed_env = {"AGENTRUN_FAULTS": fault} if where == "executor" else {}
        (first,) = executor_factory(cp, **doomed_env)
        if where == "executor":
            await eventually(lambda: not first.alive, timeout=30, message="fault never fired")
            executor_factory(cp)
        deciding = fault.startswith("control_plane.approval")
        if where == "control_plane" and not deciding:
            await eventually(lambda: not cp.process.alive, timeout=30, message="fault never fired")
            cp.restart(AGENTRUN_FAULTS="")
        pending = await wait_pending(stub, run_id)
        if deciding:
            with pytest.raises(grpc.aio.AioRpcError):  # the replica died inside the decision
                await approve(stub, pending.approval_id)
            assert await db.fetchval("SELECT count(*) FROM approvals WHERE decision IS NULL") == 1
            cp.restart(AGENTRUN_FAULTS="")
        await approve(stub, pending.approval_id)
        (run,) = await api.wait_terminal([run_id])
        assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
        assert len(await approvals_of(db, run_id)) == 1
        await check_consistent(db, run_id)
        sends = [
            r
            for r in sandbox_requests(sandbox_providers.url)
            if r["path"] == "/mail/send" and (r["idempotency_key"] or "").startswith(run_id)
        ]
        assert len(sends) == 1
        if "relay" in fault:  # redelivered under the same stable notification id
            keys = [
                r["idempotency_key"]
                for r in sandbox_requests(sandbox_providers.url)
                if (r["idempotency_key"] or "").startswith("notification:")
            ]
            assert len(keys) > len(set(keys))
    finally:
        await approver.close()
        await api.close()
