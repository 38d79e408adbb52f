"""Run limits with real processes: the deadline counts active time, max age counts it all.

The deadline (RunLimits.deadline) is a loop guard for a run that is working:
it counts the time executors hold the run, never the time it spends parked
(waiting for a person, sleeping). Max age (RunLimits.max_age) bounds the run
as a whole, parked or not. Both are copied onto the run at admission.

Waiting in these tests is the subject: the run must stay parked for longer
than its deadline, so they let that much real time pass on purpose.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from google.protobuf import duration_pb2

from agentrun.v1 import approval_pb2, approval_pb2_grpc, run_pb2
from tests.harness import auth
from tests.harness.agentrun_api import Api, pending_approval, sandbox_requests, sent_mail

APPROVER = "manager@example.com"
DEADLINE = duration_pb2.Duration(seconds=3)


@pytest.fixture
async def stack(db_url, control_plane, sandbox_model, sandbox_providers):
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url)
    # The approver decides with their own key (decided_by names them).
    key = await auth.workspace_key(db_url, "ws", role="approver", principal=APPROVER)
    approver = auth.channel(cp.address, key)
    approvals = approval_pb2_grpc.ApprovalServiceStub(approver)
    yield cp, api, approvals
    await approver.close()
    await api.close()


async def publish_mailer(api: Api, **limits) -> None:
    policy = approval_pb2.ApprovalPolicy(tools=["send_email"], approvers=[APPROVER])
    await api.publish("mailer", "approval", ["send_email"], approval=policy, **limits)


async def test_an_approval_decided_after_the_deadline_still_runs_the_call(
    stack, executor_factory, sandbox_providers
):
    cp, api, approvals = stack
    await publish_mailer(api, deadline=DEADLINE)
    run_id = await api.start("mailer", "email ada")
    executor_factory(cp)
    approval = await pending_approval(api, approvals, run_id, APPROVER)
    await asyncio.sleep(6)  # parked for twice the deadline: time passing is the subject
    await approvals.DecideApproval(
        approval_pb2.DecideApprovalRequest(
            workspace_id="ws",
            approval_id=approval.approval_id,
            approver=APPROVER,
            approve=approval_pb2.Approve(),
        )
    )
    (run,) = await api.wait_terminal([run_id])
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    assert len(sent_mail(sandbox_providers.url, run_id)) == 1
    assert run.active_duration.ToTimedelta().total_seconds() < 3
    assert run.counters.steps == len(await api.steps(run_id))


async def test_a_sleep_longer_than_the_deadline_completes(stack, executor_factory):
    cp, api, _ = stack
    await api.publish("sleeper", "long_sleep", ["sleep"], deadline=DEADLINE)
    run_id = await api.start("sleeper", "nap")
    executor_factory(cp)
    started = time.monotonic()
    (run,) = await api.wait_terminal([run_id], within=60)
    assert time.monotonic() - started >= 6
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    assert run.output.startswith("Slept")


async def test_a_run_working_past_its_active_time_fails_with_deadline_exceeded(
    stack, executor_factory, sandbox_model
):
    cp, api, _ = stack
    await api.publish("worker", "slow_worker", ["echo"], deadline=DEADLINE)
    run_id = await api.start("worker", "work")
    executor_factory(cp)
    (run,) = await api.wait_terminal([run_id], within=60)
    assert run.status == run_pb2.RUN_STATUS_FAILED
    assert run.error.startswith("deadline exceeded"), run.error
    asked = [r for r in sandbox_requests(sandbox_model.url) if r.get("run_id") == run_id]
    assert 2 <= len(asked) <= 5  # one second a reply, three seconds of active time
    assert run.counters.steps == len(await api.steps(run_id))


async def test_max_age_fails_a_run_that_waits_too_long(stack, executor_factory):
    cp, api, approvals = stack
    await publish_mailer(api, deadline=DEADLINE, max_age=duration_pb2.Duration(seconds=4))
    # An executor taking runs first: on a busy machine its start-up alone could outlast the
    # 4 s, and the run would fail its max age before ever asking for the approval.
    await api.publish("warmup", "chat", [])
    executor_factory(cp)
    await api.wait_terminal([await api.start("warmup", "hi")], within=60)
    run_id = await api.start("mailer", "email ada")
    await pending_approval(api, approvals, run_id, APPROVER)
    (run,) = await api.wait_terminal([run_id], within=30)
    assert run.status == run_pb2.RUN_STATUS_FAILED
    assert run.error.startswith("max age exceeded"), run.error
    assert run.limits.max_age.seconds == 4
    age = run.finish_time.ToDatetime() - run.create_time.ToDatetime()
    assert 4 <= age.total_seconds() < 15
    steps = await api.steps(run_id)
    assert steps[-1].kind == "finish" and steps[-1].payload["error"] == "max age exceeded"
    assert run.counters.steps == len(steps)
