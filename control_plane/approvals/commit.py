"""The approval hold: a commit that asks for an approval writes it and its notifications in
the same transaction as the proposed call and the park."""

from __future__ import annotations

import dataclasses
import functools
import uuid

from agentrun.v1 import executor_pb2
from control_plane.approvals import policy
from control_plane.dispatch.pipeline import Work
from control_plane.store import approvals as store
from control_plane.store import outbox, steps
from control_plane.store.db import Connection, Pool


class ApprovalHold:
    """The effect of a Commit that sets `approval_request` (registered in control_plane/server.py)."""

    async def prepare(self, db: Pool, req: steps.CommitRequest, msg: executor_pb2.Commit) -> Work:
        """The approval the executor asks for, checked against its own commit and resolved by
        the agent version's policy (BadApprovalRequest: the run's INVALID outcome).

        The run waits on the event (wake_at NULL): the decision wakes it, and the control
        plane's expiry loop applies the policy when nobody decides.
        """
        ask = msg.approval_request
        if req.transition.status != "waiting" or req.transition.wait_reason != "approval":
            raise policy.BadApprovalRequest("an approval request must park the run for 'approval'")
        try:
            uuid.UUID(ask.approval_id)
        except ValueError:
            raise policy.BadApprovalRequest("approval_id is not a UUID") from None
        spec = await store.run_spec(db, req.workspace_id, req.run_id)
        if spec is None:
            raise policy.BadApprovalRequest(f"run {req.run_id} has no agent version")
        approval = policy.resolve(spec, req.workspace_id, req.run_id, ask)
        notes = policy.notifications(approval, "approval_request")
        held = dataclasses.replace(
            req,
            transition=steps.Transition(
                status="waiting", wait_reason="approval", between_turns=True
            ),
        )
        return Work(functools.partial(_insert, approval, notes), held)


async def _insert(
    approval: store.NewApproval, notes: list[outbox.Notification], conn: Connection
) -> bool:
    await store.insert(conn, approval, notes)
    return False
