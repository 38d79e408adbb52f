"""Approvers are warned, and watched (issue 48): a rubber stamp is flagged to the admins.

An approval click is often the only thing between an injected instruction and its effect;
an approver who approves everything within seconds stops nothing. A workspace may set a
watch (`AdminService.SetApprovalWatch`): when an approver's approvals, each decided within
`max_decide_seconds` of being asked, reach `approvals` within `window_seconds`, the same
transaction as the approval writes a notification to the workspace's admins (delivered as
mail by the outbox relay), an `approval.approver_flagged` audit entry, and counts
`agentrun_approvers_flagged`. It fires once each time the count reaches the mark.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from agentrun.v1 import admin_pb2
from control_plane.approvals.policy import FALLBACK_APPROVER
from control_plane.auth import audit
from control_plane.ground import validate
from control_plane.ops import metrics
from control_plane.store import outbox
from control_plane.store.db import Connection
from control_plane.store.queries import run

KIND = "approver_flagged"


def to_json(watch: admin_pb2.ApprovalWatch | None) -> str | None:
    """The stored form of a watch, checked; None turns the watch off."""
    if watch is None:
        return None
    return json.dumps(
        {
            "approvals": validate.in_range("watch.approvals", watch.approvals, 2, 10000),
            "window_seconds": validate.in_range(
                "watch.window_seconds", watch.window_seconds, 60, 30 * 86400
            ),
            "max_decide_seconds": validate.in_range(
                "watch.max_decide_seconds", watch.max_decide_seconds, 1, 3600
            ),
        }
    )


def from_json(data: Any) -> admin_pb2.ApprovalWatch | None:
    if isinstance(data, str):
        data = json.loads(data)
    if not isinstance(data, dict):
        return None
    return admin_pb2.ApprovalWatch(
        approvals=int(data.get("approvals", 0)),
        window_seconds=int(data.get("window_seconds", 0)),
        max_decide_seconds=int(data.get("max_decide_seconds", 0)),
    )


async def after_approval(
    conn: Connection, workspace_id: str, approver: str, approval_id: uuid.UUID
) -> bool:
    """In the approval's transaction: flag `approver` when this approval reaches the mark."""
    row = await run(conn, "approval_watch_count", workspace_id, approver)
    watch = from_json(row["approval_watch"]) if row is not None else None
    if watch is None or row is None or row["fast"] != watch.approvals:
        return False
    summary = {
        "kind": KIND,
        "approver": approver,
        "approvals": watch.approvals,
        "window_seconds": watch.window_seconds,
        "max_decide_seconds": watch.max_decide_seconds,
        "approval_id": str(approval_id),
    }
    await outbox.insert(
        conn, outbox.Notification(workspace_id, KIND, "mail", FALLBACK_APPROVER, summary)
    )
    await audit.record(
        conn,
        "approval.approver_flagged",
        "approval",
        str(approval_id),
        summary,
        workspace_id=workspace_id,
    )
    metrics.APPROVERS_FLAGGED.labels(workspace_id).inc()
    return True


def mail_request(row: Any) -> tuple[str, dict[str, Any]]:
    """The relay's request for an approver_flagged notification: one plain mail."""
    p = json.loads(row["payload"])
    body = (
        f"{p['approver']} approved {p['approvals']} tool calls within {p['window_seconds']}s, "
        f"each within {p['max_decide_seconds']}s of being asked (the latest: approval "
        f"{p['approval_id']}). Approvals that fast may not be read: check that they are, "
        f"or change who approves.\n\nnotification {row['notification_id']}"
    )
    subject = f"Approver flagged: {p['approver']} approves quickly"
    return "/mail/send", {"to": row["recipient"], "subject": subject, "body": body}
