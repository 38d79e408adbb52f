"""Approval expiry: reject, escalate or remind at the expiry time, with no executor involved."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import datetime
from typing import Any

from control_plane.approvals.decisions import EXPIRY, decided_payload
from control_plane.approvals.policy import notifications
from control_plane.store import approvals as store
from control_plane.store import outbox
from control_plane.store.db import Connection, Pool, transaction

log = logging.getLogger(__name__)
BATCH = 50
EXPIRED_BY = "system:expiry"


def next_action(row: store.Approval) -> str:
    """What this expiry does: the policy's action while it has rounds left, else reject."""
    if row.on_expiry == "escalate" and row.escalation_level == 0 and row.escalate_to:
        return "escalate"
    if row.on_expiry == "remind" and row.reminders_sent < row.max_reminders:
        return "remind"
    return "reject"


async def _reject(conn: Connection, row: store.Approval, now: datetime | None) -> None:
    arguments = json.loads(row.arguments)
    payload = decided_payload(
        row, "expired", EXPIRED_BY, EXPIRY, arguments, reason="approval expired"
    )
    decision = store.Decision("expired", EXPIRED_BY, "approval expired")
    try:
        async with transaction(conn):
            await store.decide(conn, row.workspace_id, row.approval_id, decision, payload, now)
    except store.RunNotWaiting:
        # The run was cancelled meanwhile: close the approval without a step.
        await store.close_without_step(conn, row.workspace_id, row.approval_id, decision, now)


async def _apply(conn: Connection, row: store.Approval, now: datetime | None) -> str:
    action = next_action(row)
    ws, approval_id = row.workspace_id, row.approval_id
    if action == "reject":
        await _reject(conn, row, now)
        return action
    escalate = action == "escalate"
    new = await store.extend(
        conn,
        ws,
        approval_id,
        approvers=list(row.escalate_to) if escalate else None,
        escalate=escalate,
        remind=not escalate,
        now=now,
    )
    assert new is not None  # the row is locked and still pending
    kind = "approval_escalation" if escalate else "approval_reminder"
    for note in notifications(new, kind, list(new.approvers)):
        await outbox.insert(conn, note)
    return action


async def expire_once(pool: Pool, now: datetime | None = None) -> list[str]:
    """Apply the policy to up to BATCH pending approvals whose expiry passed; returns the
    actions. A transaction per workspace, the longest overdue first: each names one
    workspace, so on Citus it stays on one shard (no two-phase commit between workers)."""
    actions: list[str] = []
    for workspace_id in await store.expired_workspaces(pool, BATCH, now):
        if len(actions) >= BATCH:
            break
        async with transaction(pool) as conn:
            rows = await store.lock_expired(conn, workspace_id, BATCH - len(actions), now)
            actions += [await _apply(conn, row, now) for row in rows]
    return actions


async def run_forever(pool: Pool, interval: float, poke: Any) -> None:
    """The expiry loop of one replica (replicas skip each other's locked rows)."""
    while True:
        try:
            actions = await expire_once(pool)
            if any(a == "reject" for a in actions):
                poke()  # a run became runnable
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the database may be restarting
            log.warning("approval expiry failed, retrying: %s", exc)
        await asyncio.sleep(interval)
