"""The audit log from a request's point of view: who (the principal), under which request id.

Every privileged write calls `record(conn, ...)` with the connection of its
own transaction, so the audit row commits or rolls back with the write:

    async with transaction(pool) as conn:
        row = await ... the write ...
        await audit.record(conn, "agent.published", "agent", agent_id, {"version": 3})

The request id is the caller's `x-request-id` (gRPC metadata or HTTP header)
when it sent one, else one the interceptor or guard generated.
"""

from __future__ import annotations

import contextvars
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from control_plane.auth import context
from control_plane.store import identity as store
from control_plane.store.db import Connection

_REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("agentrun_request_id", default="")
_SAFE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def new_request_id(offered: str | None = None) -> str:
    """The caller's request id when it is a sane one, else a fresh one."""
    if offered and _SAFE.match(offered):
        return offered
    return uuid.uuid4().hex


@contextmanager
def request(request_id: str) -> Iterator[str]:
    token = _REQUEST_ID.set(request_id)
    try:
        yield request_id
    finally:
        _REQUEST_ID.reset(token)


def request_id() -> str:
    return _REQUEST_ID.get() or new_request_id()


def current_request_id() -> str:
    """The request id of the request being served; "" outside one (never a new one)."""
    return _REQUEST_ID.get()


async def record(
    conn: Connection,
    action: str,
    object_kind: str,
    object_id: str,
    detail: dict[str, Any] | None = None,
    *,
    workspace_id: str | None = None,
    actor: str | None = None,
) -> store.AuditEntry:
    """Append an audit row for the current principal, in `conn`'s transaction.

    The workspace is the principal's unless given (platform writes name the
    workspace they touch, or store.PLATFORM_AUDIT for platform-level keys).
    `actor` names who acted where no principal is in context (a capability
    link's approver, a Slack user: `link:alice@example.com`, `slack:U123`).
    """
    if actor is None:
        who = context.current()
        actor, workspace_id = who.label, workspace_id or who.workspace_id
    ws = workspace_id or store.PLATFORM_AUDIT
    event = store.AuditEvent(ws, actor, action, object_kind, object_id, request_id(), detail)
    return await store.audit(conn, event)
