"""The run's step counter counts what its log holds, whoever wrote the steps.

Real control plane, executors, Postgres and sandboxes: runs through an
approval, an unknown tool outcome decided by a person, and cancellation.
"""

from __future__ import annotations

import pytest

from agentrun.v1 import approval_pb2, approval_pb2_grpc, run_pb2
from tests.harness import auth
from tests.harness.agentrun_api import Api, clear_faults, set_fault
from tests.harness.waiting import eventually

APPROVER = "manager@example.com"


@pytest.fixture
async def api(db_url, control_plane, sandbox_model, sandbox_providers):
    cp = control_plane(db_url)
    client = await Api.connect(cp.address, db_url)
    client.cp = cp  # type: ignore[attr-defined]
    policy = approval_pb2.ApprovalPolicy(tools=["send_email"], approvers=[APPROVER])
    await client.publish("mailer", "approval", ["send_email"], approval=policy)
    await client.publish("poster", "poster", ["chat_post"])
    yield client
    await client.close()
    clear_faults(sandbox_providers.url)


async def assert_counted(api: Api, run_id: str) -> run_pb2.Run:
    run = await api.get(run_id)
    steps = await api.steps(run_id)
    assert run.counters.steps == len(steps), [s.kind for s in steps]
    return run


async def pending_approval(api: Api, run_id: str) -> approval_pb2.Approval:
    approvals = approval_pb2_grpc.ApprovalServiceStub(api.channel)

    async def one():
        resp = await approvals.ListApprovals(
            approval_pb2.ListApprovalsRequest(
                workspace_id="ws", approver=APPROVER, state=approval_pb2.APPROVAL_STATE_PENDING
            )
        )
        mine = [a for a in resp.approvals if a.run_id == run_id]
        run = await api.get(run_id)
        return mine[0] if mine and run.wait_reason == "approval" else None

    return await eventually(one, timeout=30, message="the run never waited for an approval")


async def test_a_run_through_an_approval_counts_every_step(api, executor_factory):
    run_id = await api.start("mailer", "email ada")
    executor_factory(api.cp)
    approval = await pending_approval(api, run_id)
    await assert_counted(api, run_id)  # parked: the request and the park are counted
    # The approver decides with their own key.
    key = await auth.workspace_key(api.db_url, "ws", role="approver", principal=APPROVER)
    async with auth.channel(api.channel_target, key) as own:
        await approval_pb2_grpc.ApprovalServiceStub(own).DecideApproval(
            approval_pb2.DecideApprovalRequest(
                workspace_id="ws",
                approval_id=approval.approval_id,
                approver=APPROVER,
                approve=approval_pb2.Approve(),
            )
        )
    (run,) = await api.wait_terminal([run_id])
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    kinds = [s.kind for s in await api.steps(run_id)]
    assert {"approval_requested", "approval_decided"} <= set(kinds)
    await assert_counted(api, run_id)


async def test_a_run_through_an_unknown_outcome_counts_every_step(
    api, executor_factory, sandbox_providers
):
    run_id = await api.start("poster")
    set_fault(
        sandbox_providers.url,
        provider="chat",
        key_prefix=f"{run_id}:",
        count=1,
        mode="error",
        status=500,
    )
    executor_factory(api.cp)
    unknown = await eventually(
        lambda: api.awaiting_person(run_id), timeout=30, message="run never waited for a person"
    )
    await assert_counted(api, run_id)
    await api.resolve_unknown(run_id, unknown.seq, "not_happened")
    await assert_counted(api, run_id)  # the person's decision is a step of the log
    (run,) = await api.wait_terminal([run_id])
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    await assert_counted(api, run_id)


async def test_cancelled_runs_count_every_step(api, executor_factory):
    queued = await api.start("mailer", "never runs")
    await api.runs.CancelRun(run_pb2.CancelRunRequest(workspace_id="ws", run_id=queued))
    run = await assert_counted(api, queued)
    assert (run.status, run.counters.steps) == (run_pb2.RUN_STATUS_CANCELLED, 2)

    waiting = await api.start("mailer", "email ada")
    executor_factory(api.cp)
    await pending_approval(api, waiting)
    await api.runs.CancelRun(run_pb2.CancelRunRequest(workspace_id="ws", run_id=waiting))
    run = await assert_counted(api, waiting)
    assert run.status == run_pb2.RUN_STATUS_CANCELLED
