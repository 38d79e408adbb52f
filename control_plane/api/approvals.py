"""ApprovalService: list, get and decide approvals over gRPC."""

from __future__ import annotations

import grpc

from agentrun.v1 import approval_pb2, approval_pb2_grpc
from control_plane.api import convert, validate
from control_plane.api.runs import decode_page_token, encode_page_token
from control_plane.approvals import decisions, tokens
from control_plane.auth import context as auth_context
from control_plane.errors import InvalidArgument, NotFound, PermissionDenied
from control_plane.store import approvals as store
from control_plane.store.db import Pool, Record

STATE_FROM_PROTO = {
    approval_pb2.APPROVAL_STATE_PENDING: "pending",
    approval_pb2.APPROVAL_STATE_APPROVED: "approved",
    approval_pb2.APPROVAL_STATE_REJECTED: "rejected",
    approval_pb2.APPROVAL_STATE_EDITED: "edited",
    approval_pb2.APPROVAL_STATE_EXPIRED: "expired",
}
STATE_TO_PROTO = {v: k for k, v in STATE_FROM_PROTO.items()}
EXPIRY_TO_PROTO = {
    "reject": approval_pb2.EXPIRY_ACTION_REJECT,
    "escalate": approval_pb2.EXPIRY_ACTION_ESCALATE,
    "remind": approval_pb2.EXPIRY_ACTION_REMIND,
}


def to_proto(row: Record) -> approval_pb2.Approval:
    msg = approval_pb2.Approval(
        workspace_id=row["workspace_id"], approval_id=str(row["approval_id"]),
        run_id=str(row["run_id"]), decision_seq=row["decision_seq"], call_id=row["call_id"],
        tool=row["tool"], arguments_json=row["arguments"],
        arguments_sha256=row["arguments_sha256"],
        state=STATE_TO_PROTO[row["decision"] or "pending"],
        approvers=row["approvers"], slack_approvers=row["slack_approvers"],
        high_risk=row["high_risk"], moves_money=row["moves_money"],
        on_expiry=EXPIRY_TO_PROTO[row["on_expiry"]], escalation_level=row["escalation_level"],
        reminders_sent=row["reminders_sent"], decided_by=row["decided_by"] or "",
        reason=row["reason"] or "", edited_arguments_json=row["edited_arguments"] or "",
    )  # fmt: skip
    for field, column in (("expire_time", "expire_at"), ("decide_time", "decided_at"),
                          ("create_time", "created_at")):  # fmt: skip
        ts = convert.timestamp(row[column])
        if ts is not None:
            getattr(msg, field).CopyFrom(ts)
    return msg


def _bearer(context: grpc.aio.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization" and value.lower().startswith("bearer "):
            # An agentrun API key authenticated the call (the interceptor); not a token here.
            return None if value[7:].startswith("agr_") else value[7:]
    return None


class ApprovalServicer(approval_pb2_grpc.ApprovalServiceServicer):
    def __init__(self, pool: Pool, signing_key: bytes | None) -> None:
        self._pool = pool
        self._key = signing_key

    async def ListApprovals(
        self, request: approval_pb2.ListApprovalsRequest, context: grpc.aio.ServicerContext
    ) -> approval_pb2.ListApprovalsResponse:
        ws = auth_context.workspace(request.workspace_id)
        size = validate.in_range("page_size", request.page_size or 50, 1, 500)
        if request.state and request.state not in STATE_FROM_PROTO:
            raise InvalidArgument("state", f"unknown state {request.state}")
        rows, more = await store.list_page(
            self._pool, ws, approver=request.approver or None,
            state=STATE_FROM_PROTO.get(request.state), after=decode_page_token(request.page_token),
            limit=size,
        )  # fmt: skip
        token = encode_page_token(rows[-1]["created_at"], rows[-1]["approval_id"]) if more else ""
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
        approver = validate.text("approver", request.approver, max_bytes=200, required=True)
        action = request.WhichOneof("decision")
        if action is None:
            raise InvalidArgument("decision", "one of approve, reject or edit is required")
        via = "operator"
        bearer = _bearer(context)
        if bearer is not None:
            try:
                who = tokens.verify_bearer(self._key, bearer)
            except tokens.BadBearer as exc:
                raise PermissionDenied(str(exc)) from None
            if (who.user, who.workspace_id) != (approver, ws):
                raise PermissionDenied("the bearer token is not this approver's")
            via = "signed_in"
        row = await store.get(self._pool, ws, approval_id)
        if row is not None and row["high_risk"] and via != "signed_in":
            raise PermissionDenied(
                f"tool {row['tool']!r} is high-risk: send the approver's bearer token"
            )
        decided = await decisions.decide(self._pool, decisions.Request(
            workspace_id=ws, approval_id=approval_id, approver=approver, action=action, via=via,
            reason=request.reject.reason, edited_arguments_json=request.edit.arguments_json,
            note=request.edit.note,
        ))  # fmt: skip
        return approval_pb2.DecideApprovalResponse(approval=to_proto(decided))


__all__ = ["ApprovalServicer", "to_proto"]
