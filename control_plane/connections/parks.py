"""Runs parked on a connection: the park, the connection marked, its owner asked once.

The executor parks a run as wait_reason "connection" (no wake time) before a tool call is
sent when the connection cannot be used: the control plane refused its token (revoked,
needs_reauth) or the provider refused the token before acting (401, or 403
insufficient_scope). In the commit's transaction (ConnectionPark, an effect of the commit
pipeline: dispatch/pipeline.py) the connection becomes needs_reauth and,
the first time since it last worked, one notification to its owner goes into the outbox
with the reconnect link. Reconnecting (control_plane/connections/flows.py) sets
wake_at = now() on every run waiting on it.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from agentrun.v1 import executor_pb2 as pb
from control_plane.dispatch.pipeline import Work
from control_plane.store import connections as store
from control_plane.store import outbox
from control_plane.store import steps as step_store
from control_plane.store.db import Connection, Pool

WAIT_REASON = "connection"
KIND = "connection_reauth"
# Owners that are not people (keys) are reached here, as approvals' fallback is.
FALLBACK_RECIPIENT = "admin@localhost"


def recipient(owner: str) -> str:
    """Where to ask a connection's owner (a principal label, kind:name) to reconnect."""
    kind, _, name = owner.partition(":")
    return name if kind == "person" and "@" in name else FALLBACK_RECIPIENT


class ConnectionPark:
    """The effect of a park for WAIT_REASON (registered in control_plane/server.py)."""

    async def prepare(self, db: Pool, req: step_store.CommitRequest, msg: pb.Commit) -> Work | None:
        """Mark the connection the run waits for, if the park names one."""
        cid = req.transition.waiting_connection_id
        return None if cid is None else Work(functools.partial(_mark_broken, req, str(cid)))


async def _mark_broken(req: step_store.CommitRequest, cid: str, conn: Connection) -> bool:
    """The connection needs_reauth and, the first time since it last worked, its owner asked."""
    row = await store.mark_broken(conn, req.workspace_id, cid, "a run could not use it")
    if row is not None:
        payload = {
            "kind": KIND,
            "connection_id": cid,
            "provider": row["provider"],
            "account": row["account"],
            "run_id": str(req.run_id),
            "scopes": list(row["scopes"]),
        }
        note = outbox.Notification(req.workspace_id, KIND, "mail", recipient(row["owner"]), payload)
        await outbox.insert(conn, note)
    return False


def mail_request(row: Any, public_url: str) -> tuple[str, dict[str, Any]]:
    """The relay's request for a connection_reauth notification: one mail with the link."""
    payload = json.loads(row["payload"])
    link = (
        f"{public_url}/connections/{row['workspace_id']}/{payload['provider']}/start"
        f"?connection_id={payload['connection_id']}&login_hint={payload['account']}"
        f"&scope={'+'.join(payload.get('scopes') or [])}"
    )
    body = (
        f"Agent runs wait for your {payload['provider']} connection ({payload['account']}): "
        f"the provider no longer accepts it, or it lacks a scope a tool needs.\n\n"
        f"Reconnect: {link}\n\nnotification {row['notification_id']}"
    )
    subject = f"Reconnect {payload['provider']} for your agents"
    return "/mail/send", {"to": row["recipient"], "subject": subject, "body": body}
