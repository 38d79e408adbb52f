"""The store's clock is injectable: every time the run core acts on follows a given `now`.

The test clock is years away from the database's, so any query still reading now() shows.
(The lease property test checks the same for every lease operation at random.)
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

from control_plane.store import approvals, lease, runs, steps
from tests import factories
from tests.harness.commits import commit_with_approval

T = datetime(2031, 6, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T + timedelta(seconds=seconds)


async def _admitted(pool) -> runs.Run:
    version = await factories.agent_version(pool)
    adm = runs.Admission(
        workspace_id="ws",
        agent_id="agent",
        agent_version=version,
        input="go",
        request_id=None,
        max_steps=50,
        max_tokens=1000,
        max_tool_calls=10,
        deadline_seconds=3600,
    )
    return await runs.insert_run(pool, adm, now=T)


def _step(seq: int, kind: str = "model_decision") -> steps.NewStep:
    return steps.NewStep(seq, kind, None, json.dumps({"content": "x", "tool_calls": []}))


async def test_claim_heartbeat_commit_and_cancel_follow_the_given_clock(pool):
    run = await _admitted(pool)
    (held,) = await lease.claim_due(pool, ["ex"], 30, now=at(1))
    assert (held.started_at, held.wake_at) == (at(1), at(31))
    key = lease.LeaseKey("ws", run.run_id, held.lease_epoch)
    beat = await lease.heartbeat(pool, "ex", [key], 30, now=at(20))
    assert beat.renewed == {key: at(50)}
    req = steps.CommitRequest("ws", run.run_id, key.epoch, [_step(1)])
    assert (await steps.commit(pool, req, 30, now=at(40))).wake_at == at(70)
    park = steps.Transition("waiting", "sleep", wake_after_seconds=100)
    req = steps.CommitRequest("ws", run.run_id, key.epoch, [_step(2)], park)
    assert (await steps.commit(pool, req, 30, now=at(45))).wake_at == at(145)
    (again,) = await lease.claim_due(pool, ["ex"], 30, now=at(145))
    assert again.started_at == at(1), "started_at is the first claim's"
    again_key = lease.LeaseKey("ws", run.run_id, again.lease_epoch)
    await lease.release_unassigned(pool, again_key, now=at(150))
    row = await runs.get_run(pool, "ws", run.run_id)
    assert (row.status, row.wake_at) == ("waiting", at(150))
    cancelled = await runs.cancel_run(pool, "ws", run.run_id, "stop", now=at(160))
    assert cancelled.finished_at == at(160)


async def test_approvals_and_their_tokens_follow_the_given_clock(pool):
    run = await _admitted(pool)
    (held,) = await lease.claim_due(pool, ["ex"], 30, now=at(1))
    approval = approvals.NewApproval(
        workspace_id="ws",
        approval_id=uuid.uuid4(),
        run_id=run.run_id,
        decision_seq=1,
        call_id="c1",
        tool="pay",
        arguments_json="{}",
        arguments_sha256="0" * 64,
        approvers=["pat"],
        slack_approvers=[],
        high_risk=False,
        moves_money=False,
        expiry_seconds=600,
        on_expiry="reject",
        escalate_to=[],
        max_reminders=0,
    )
    req = steps.CommitRequest(
        "ws",
        run.run_id,
        held.lease_epoch,
        [_step(1, "approval_requested")],
        steps.Transition("waiting", "approval"),
    )
    await commit_with_approval(pool, req, 30, approval, [], now=at(10))
    stored = await approvals.get(pool, "ws", approval.approval_id)
    assert stored.expire_at == at(610)

    digest = b"\x01" * 32
    await approvals.insert_token(pool, "ws", digest, approval.approval_id, "pat", at(100))
    assert not (await approvals.peek_token(pool, "ws", digest, now=at(99)))["expired"]
    assert (await approvals.peek_token(pool, "ws", digest, now=at(100)))["expired"]
    assert await approvals.use_token(pool, "ws", digest, now=at(100)) is None
    assert await approvals.use_token(pool, "ws", digest, now=at(50)) is not None

    d = approvals.Decision("approved", "person:pat")
    async with pool.acquire() as conn, conn.transaction():
        await approvals.decide(conn, "ws", approval.approval_id, d, {}, now=at(60))
    row = await runs.get_run(pool, "ws", run.run_id)
    assert (row.status, row.wake_at) == ("waiting", at(60))
