"""The approval transaction: proposed call, approval, notifications and park, together."""

from __future__ import annotations

import dataclasses
import uuid

from agentrun.v1 import executor_pb2
from control_plane.approvals import policy
from control_plane.store import approvals as store
from control_plane.store import steps
from control_plane.store.db import Pool


async def approval_commit(
    pool: Pool,
    req: steps.CommitRequest,
    ask: executor_pb2.ApprovalRequest,
    lease_seconds: float,
) -> steps.CommitResult:
    """Commit the executor's steps and park the run on a new approval, atomically.

    The run waits on the event (wake_at NULL): the decision wakes it, and the
    control plane's expiry loop applies the policy when nobody decides.
    """
    if req.transition.status != "waiting" or req.transition.wait_reason != "approval":
        raise policy.BadApprovalRequest("an approval request must park the run for 'approval'")
    try:
        uuid.UUID(ask.approval_id)
    except ValueError:
        raise policy.BadApprovalRequest("approval_id is not a UUID") from None
    spec = await store.run_spec(pool, req.workspace_id, req.run_id)
    if spec is None:
        raise policy.BadApprovalRequest(f"run {req.run_id} has no agent version")
    approval = policy.resolve(spec, req.workspace_id, req.run_id, ask)
    held = dataclasses.replace(
        req, transition=steps.Transition(status="waiting", wait_reason="approval")
    )
    notes = policy.notifications(approval, "approval_request")
    return await store.commit_with_approval(pool, held, lease_seconds, approval, notes)
