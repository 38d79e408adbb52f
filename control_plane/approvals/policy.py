"""An agent version's approval policy, resolved for one held tool call."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from typing import Any

from agentrun.v1 import approval_pb2, executor_pb2
from control_plane.approvals.hashing import arguments_sha256
from control_plane.dispatch.pipeline import CommitRefused
from control_plane.ground import validate
from control_plane.ground.errors import InvalidArgument
from control_plane.store.approvals import Approval, NewApproval
from control_plane.store.outbox import Notification

DEFAULT_EXPIRY_SECONDS = 24 * 3600
DEFAULT_MAX_REMINDERS = 2
# Who decides when a policy names nobody: the workspace's administrators (a signed-in
# member with the admin role matches this entry; see decisions.on_list).
FALLBACK_APPROVER = "admin"
EXPIRY_ACTIONS = {0: "reject", 1: "reject", 2: "escalate", 3: "remind"}
MAX_ORIGINS = 32


class BadApprovalRequest(CommitRefused):
    """The executor asked for an approval that does not match its own arguments."""


def resolve(
    spec: dict[str, Any], workspace_id: str, run_id: uuid.UUID, req: executor_pb2.ApprovalRequest
) -> NewApproval:
    """The approval row for a held call, with the policy copied from the agent version."""
    pol = spec.get("approval") or {}
    if arguments_sha256(_parse(req.arguments_json)) != req.arguments_sha256:
        raise BadApprovalRequest("arguments_sha256 does not match arguments_json")
    approvers = list(pol.get("approvers") or [])
    slack = list(pol.get("slack_approvers") or [])
    on_expiry = pol.get("on_expiry") or "reject"
    escalate_to = list(pol.get("escalate_to") or [])
    if on_expiry == "escalate" and not escalate_to:
        on_expiry = "reject"
    return NewApproval(
        workspace_id=workspace_id,
        approval_id=uuid.UUID(req.approval_id),
        run_id=run_id,
        decision_seq=req.decision_seq,
        call_id=req.call_id,
        tool=req.tool,
        arguments_json=req.arguments_json,
        arguments_sha256=req.arguments_sha256,
        approvers=approvers or ([] if slack else [FALLBACK_APPROVER]),
        slack_approvers=slack,
        high_risk=req.high_risk or req.tool in (pol.get("high_risk_tools") or []),
        moves_money=req.moves_money,
        expiry_seconds=pol.get("expiry_seconds") or DEFAULT_EXPIRY_SECONDS,
        on_expiry=on_expiry,
        escalate_to=escalate_to,
        max_reminders=pol.get("max_reminders") or DEFAULT_MAX_REMINDERS,
        argument_origins_json=origins_json(req.argument_origins),
    )


def origins_json(origins: Iterable[approval_pb2.ArgumentOrigin]) -> str:
    """The executor's argument origins as stored with the approval (bounded, like any
    executor-supplied text)."""
    out = [
        {
            "argument": o.argument[:200],
            "value": o.value[:500],
            "seq": o.seq,
            "step_kind": o.step_kind[:40],
            "tool": o.tool[:100],
            "untrusted": o.untrusted,
            "summary": o.summary[:300],
        }
        for o in list(origins)[:MAX_ORIGINS]
    ]
    return json.dumps(out)


def origins_of(row: NewApproval | Approval) -> list[dict[str, Any]]:
    text = row.argument_origins_json if isinstance(row, NewApproval) else row.argument_origins
    data = json.loads(text or "[]")
    return data if isinstance(data, list) else []


def _parse(text: str) -> Any:
    try:
        return validate.json_value("approval_request.arguments_json", text)
    except InvalidArgument as exc:
        raise BadApprovalRequest(str(exc)) from None


def notifications(
    row: NewApproval | Approval, kind: str, approvers: list[str] | None = None
) -> list[Notification]:
    """One mail per approver, one chat post for the Slack approvers; no tokens yet.

    The relay mints each link's single-use token at delivery time, so the
    database never holds a usable token.
    """
    summary = {
        "kind": kind,
        "approval_id": str(row.approval_id),
        "run_id": str(row.run_id),
        "tool": row.tool,
        "arguments_sha256": row.arguments_sha256,
        "high_risk": row.high_risk,
        "moves_money": row.moves_money,
    }
    origins = origins_of(row)
    if origins:  # the approver is warned: values an outsider put there, and where from
        summary["origins"] = origins
    ws = row.workspace_id
    notes = [
        Notification(ws, kind, "mail", approver, summary)
        for approver in (approvers if approvers is not None else row.approvers)
    ]
    if row.slack_approvers and approvers is None:
        notes.append(Notification(ws, kind, "chat", "#approvals", summary))
    return notes
