"""ApprovalService: list, get and decide approvals over gRPC."""

from __future__ import annotations

import grpc

from agentrun.v1 import approval_pb2, approval_pb2_grpc
from control_plane.api.runs import decode_page_token, encode_page_token
from control_plane.approvals import decisions, policy
from control_plane.auth import context as auth_context
from control_plane.auth.principal import Principal
from control_plane.ground import convert, validate
from control_plane.ground.errors import InvalidArgument, NotFound, PermissionDenied
from control_plane.store import approvals as store
from control_plane.store.db import Pool

STATE_FROM_PROTO = {
    approval_pb2.APPROVAL_STATE_PENDING: "pending",
    approval_pb2.APPROVAL_STATE_APPROVED: "approved",
    approval_pb2.APPROVAL_STATE_REJECTED: "rejected",
    approval_pb2.APPROVAL_STATE_EDITED: "edited",
    approval_pb2.APPROVAL_STATE_EXPIRED: "expired",
    approval_pb2.APPROVAL_STATE_CLOSED: "closed",
}
STATE_TO_PROTO = {v: k for k, v in STATE_FROM_PROTO.items()}
EXPIRY_TO_PROTO = {
    "reject": approval_pb2.EXPIRY_ACTION_REJECT,
    "escalate": approval_pb2.EXPIRY_ACTION_ESCALATE,
    "remind": approval_pb2.EXPIRY_ACTION_REMIND,
}


def to_proto(row: store.Approval) -> approval_pb2.Approval:
    msg = approval_pb2.Approval(
        workspace_id=row.workspace_id,
        approval_id=str(row.approval_id),
        run_id=str(row.run_id),
        decision_seq=row.decision_seq,
        call_id=row.call_id,
        tool=row.tool,
        arguments_json=row.arguments,
        arguments_sha256=row.arguments_sha256,
        state=STATE_TO_PROTO[row.decision or "pending"],
        approvers=row.approvers,
        slack_approvers=row.slack_approvers,
        high_risk=row.high_risk,
        moves_money=row.moves_money,
        on_expiry=EXPIRY_TO_PROTO[row.on_expiry],
        escalation_level=row.escalation_level,
        reminders_sent=row.reminders_sent,
        decided_by=row.decided_by or "",
        reason=row.reason or "",
        edited_arguments_json=row.edited_arguments or "",
        argument_origins=[approval_pb2.ArgumentOrigin(**o) for o in policy.origins_of(row)],
    )
    for field, value in (
        ("expire_time", row.expire_at),
        ("decide_time", row.decided_at),
        ("create_time", row.created_at),
    ):
        ts = convert.timestamp(value)
        if ts is not None:
            getattr(msg, field).CopyFrom(ts)
    return msg


class ApprovalServicer(approval_pb2_grpc.ApprovalServiceServicer):
    """Every RPC acts in the caller's workspace; a decision is the caller's own."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def ListApprovals(
        self, request: approval_pb2.ListApprovalsRequest, context: grpc.aio.ServicerContext
    ) -> approval_pb2.ListApprovalsResponse:
        ws = auth_context.workspace(request.workspace_id)
        size = validate.in_range("page_size", request.page_size or 50, 1, 500)
        if request.state and request.state not in STATE_FROM_PROTO:
            raise InvalidArgument("state", f"unknown state {request.state}")
        rows, more = await store.list_page(
            self._pool,
            ws,
            approver=request.approver or None,
            state=STATE_FROM_PROTO.get(request.state),
            after=decode_page_token(request.page_token),
            limit=size,
        )
        token = encode_page_token(rows[-1].created_at, rows[-1].approval_id) if more else ""
        return approval_pb2.ListApprovalsResponse(
            approvals=[to_proto(r) for r in rows], next_page_token=token
        )

    async def GetApproval(
        self, request: approval_pb2.GetApprovalRequest, context: grpc.aio.ServicerContext
    ) -> approval_pb2.GetApprovalResponse:
        ws = auth_context.workspace(request.workspace_id)
        approval_id = validate.run_id("approval_id", request.approval_id)
        row = await store.get(self._pool, ws, approval_id)
        if row is None:
            raise NotFound(f"approval {approval_id} not found")
        return approval_pb2.GetApprovalResponse(approval=to_proto(row))

    async def DecideApproval(
        self, request: approval_pb2.DecideApprovalRequest, context: grpc.aio.ServicerContext
    ) -> approval_pb2.DecideApprovalResponse:
        ws = auth_context.workspace(request.workspace_id)
        approval_id = validate.run_id("approval_id", request.approval_id)
        action = request.WhichOneof("decision")
        if action is None:
            raise InvalidArgument("decision", "one of approve, reject or edit is required")
        decider = decider_of(auth_context.current(), request.approver)
        decided = await decisions.decide(
            self._pool,
            decisions.Request(
                workspace_id=ws,
                approval_id=approval_id,
                decider=decider,
                action=action,
                reason=request.reject.reason,
                edited_arguments_json=request.edit.arguments_json,
                note=request.edit.note,
            ),
        )
        return approval_pb2.DecideApprovalResponse(approval=to_proto(decided))


def decider_of(principal: Principal, typed_approver: str) -> decisions.Decider:
    """The caller decides as itself; the deprecated `approver` field may only repeat its name."""
    validate.text("approver", typed_approver, max_bytes=320)
    if typed_approver and typed_approver != principal.name:
        raise PermissionDenied(
            "approver: a decision is recorded as the authenticated caller; leave the field empty"
        )
    return decisions.Decider.of(principal)


__all__ = ["ApprovalServicer", "decider_of", "to_proto"]
