"""Runs that need a person: the repetition guard's hold notifies through the outbox.

When the executor holds a repeated call (a `tool_result` with status
`repeated` and `"held": "repeat"`, committed with a park for `repeat`), the
same transaction (HeldRepeat, an effect of the commit pipeline: dispatch/pipeline.py)
writes one notification per person the agent version names
as approvers (else the workspace's administrator), so nobody has to poll for
runs that stopped. The relay delivers them as mail; the person decides with
RunService.ResolveUnknownOutcome on the held step, or cancels the run.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from agentrun.v1 import executor_pb2 as pb
from control_plane.approvals.policy import FALLBACK_APPROVER
from control_plane.dispatch.pipeline import Work
from control_plane.store import approvals as approval_store
from control_plane.store import outbox
from control_plane.store import steps as step_store
from control_plane.store.db import Connection, Pool

KIND = "run_needs_help"
REPEAT_WAIT = "repeat"


def held_repeat(req: step_store.CommitRequest) -> tuple[int, dict[str, Any]] | None:
    """The held repeat this commit records (its seq and payload), if it parks for one."""
    if req.transition.status != "waiting" or req.transition.wait_reason != REPEAT_WAIT:
        return None
    for step in req.steps:
        if step.kind != "tool_result":
            continue
        payload = json.loads(step.payload_json or "{}")
        if isinstance(payload, dict) and payload.get("held") == "repeat":
            return step.seq, payload
    return None  # a park again for the same hold: its notification went out already


def notifications(
    spec: dict[str, Any] | None, req: step_store.CommitRequest, seq: int, held: dict[str, Any]
) -> list[outbox.Notification]:
    approvers = list(((spec or {}).get("approval") or {}).get("approvers") or [])
    summary = {
        "kind": KIND,
        "run_id": str(req.run_id),
        "seq": seq,
        "tool": held.get("tool"),
        "reason": "repeat",
        "detail": str(held.get("error") or "")[:2000],
    }
    return [
        outbox.Notification(req.workspace_id, KIND, "mail", who, summary)
        for who in approvers or [FALLBACK_APPROVER]
    ]


class HeldRepeat:
    """The effect of a park for REPEAT_WAIT (registered in control_plane/server.py)."""

    async def prepare(self, db: Pool, req: step_store.CommitRequest, msg: pb.Commit) -> Work | None:
        """The notifications of the held repeat this commit records; None if it holds none."""
        found = held_repeat(req)
        if found is None:
            return None
        spec = await approval_store.run_spec(db, req.workspace_id, req.run_id)
        return Work(functools.partial(_notify, notifications(spec, req, *found)))


async def _notify(notes: list[outbox.Notification], conn: Connection) -> bool:
    for note in notes:
        await outbox.insert(conn, note)
    return False


def mail_request(row: Any) -> tuple[str, dict[str, Any]]:
    """The relay's request for a run_needs_help notification: one plain mail."""
    payload = json.loads(row["payload"])
    nid = str(row["notification_id"])
    body = (
        f"Agent run {payload['run_id']} stopped and waits for you: {payload['detail']}\n\n"
        f"Decide on step {payload['seq']} (agentrun runs resolve: retry lets the call run, "
        f"not_happened refuses it, fail_run stops the run) or cancel the run.\n\n"
        f"notification {nid}"
    )
    subject = f"Agent run needs help: repeated {payload.get('tool')}"
    return "/mail/send", {"to": row["recipient"], "subject": subject, "body": body}
