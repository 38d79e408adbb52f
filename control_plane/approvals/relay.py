"""The outbox relay: delivers approval notifications after their transaction committed.

At least once: a row is claimed with its next attempt already pushed out, so a
relay that dies between the post and the `delivered` mark leaves it to be
posted again. Every post carries the notification's stable id (header and
body), so the receiving side can recognise a redelivery.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

import aiosmtplib
import httpx

import faults
from control_plane.approvals import needs_help, policy, tokens, unknown_outcome, watch
from control_plane.channels import alerts, closing, routing
from control_plane.channels.delivery import ChannelRefused
from control_plane.connections import parks as connection_parks
from control_plane.crypto.envelope import CannotOpen, Envelope
from control_plane.store import approvals as approval_store
from control_plane.store import outbox
from control_plane.store.db import Pool
from control_plane.store.errors import DATABASE_ERRORS

log = logging.getLogger(__name__)
BATCH = 20
# What a failed delivery attempt raises: logged, counted, tried again after a backoff.
_UNDELIVERED: tuple[type[Exception], ...] = (
    httpx.HTTPError,
    OSError,
    aiosmtplib.SMTPException,
    ChannelRefused,
    CannotOpen,
    *DATABASE_ERRORS,
)


class Skipped(Exception):
    """A notification that must not go out any more (its approval closed)."""


@dataclass(frozen=True)
class RelayConfig:
    notify_url: str  # base URL of the mail and chat providers
    public_url: str  # where approval links point (the control plane's HTTP ingress)
    backoff_seconds: float = 1.0
    interval_seconds: float = 0.5
    # Opens workspace channels' secrets (control_plane/channels); None: no channels.
    envelope: Envelope | None = None


async def _link(pool: Pool, cfg: RelayConfig, row: Any, approval: approval_store.Approval) -> str:
    """A fresh single-use link for this recipient; only the token's hash is stored."""
    token = tokens.mint()
    await approval_store.insert_token(
        pool,
        row["workspace_id"],
        tokens.digest(token),
        approval.approval_id,
        row["recipient"],
        approval.expire_at,
    )
    return f"{cfg.public_url}/approvals/{row['workspace_id']}/{token}"


def _text(approval: approval_store.Approval, kind: str) -> str:
    verb = {"approval_reminder": "Reminder: ", "approval_escalation": "Escalated: "}.get(kind, "")
    text = (
        f"{verb}agent run {approval.run_id} wants to call {approval.tool} with "
        f"{json.dumps(json.loads(approval.arguments), sort_keys=True)}"
    )
    origins = policy.origins_of(approval)
    if not origins:
        return text
    # The warning comes first: a value an outsider supplied is what an approver must see.
    lines = [f"- {o.get('argument')} {o.get('value')}: {o.get('summary')}" for o in origins]
    warning = "WARNING: UNTRUSTED VALUES. These arguments came from outside content, not from you:"
    return "\n".join([warning, *lines, "", text])


async def _request(pool: Pool, cfg: RelayConfig, row: Any) -> tuple[str, dict]:
    if row["kind"] == needs_help.KIND:
        return needs_help.mail_request(row)
    if row["kind"] in unknown_outcome.KINDS:
        return unknown_outcome.request(row)
    if row["kind"] == watch.KIND:
        return watch.mail_request(row)
    if row["kind"] == connection_parks.KIND:
        return connection_parks.mail_request(row, cfg.public_url)
    if row["kind"] == alerts.KIND:
        return alerts.mail_request(row)
    payload = json.loads(row["payload"])
    approval = await approval_store.get(pool, row["workspace_id"], payload["approval_id"])
    if approval is None:  # rows are never deleted; this would be a broken invariant
        raise LookupError(f"notification {row['notification_id']} names no approval")
    if approval.decision == approval_store.CLOSED:
        raise Skipped(f"approval closed: {approval.reason}")  # nobody may decide it any more
    text = _text(approval, row["kind"])
    nid = str(row["notification_id"])
    if row["channel"] == "mail":
        link = await _link(pool, cfg, row, approval)
        body = f"{text}\n\nReview and decide: {link}\n\nnotification {nid}"
        return "/mail/send", {
            "to": row["recipient"],
            "subject": f"Approval needed: {approval.tool}",
            "body": body,
        }
    value = f"{row['workspace_id']}:{approval.approval_id}"
    return "/chat/messages", {
        "channel": row["recipient"],
        "text": text,
        "notification_id": nid,
        "actions": [
            {"action_id": "approve", "value": value},
            {"action_id": "reject", "value": value},
        ],
    }


async def _send(
    pool: Pool, client: httpx.AsyncClient, cfg: RelayConfig, row: Any
) -> dict[str, Any] | None:
    """Send one row: through the workspace's channel of its kind, else the deployment's
    notifier. Returns what the channel answered (the receipt kept with the row)."""
    if row["channel"] == "webhook":
        return await routing.webhook(pool, cfg.envelope, client, row)
    if row["kind"] == closing.KIND:
        return await closing.edit_sent(pool, cfg.envelope, client, row)
    try:
        path, body = await _request(pool, cfg, row)
    except Skipped as skipped:
        return {"skipped": str(skipped)}
    receipt = await routing.through_channel(pool, cfg.envelope, client, row, body)
    if receipt is not None:
        return receipt
    nid = row["notification_id"]
    resp = await client.post(
        f"{cfg.notify_url}{path}",
        json=body,
        headers={"Idempotency-Key": f"notification:{nid}", "X-Agentrun-Notification": str(nid)},
    )
    resp.raise_for_status()
    return None


async def deliver(pool: Pool, client: httpx.AsyncClient, cfg: RelayConfig, row: Any) -> bool:
    ws, nid = row["workspace_id"], row["notification_id"]
    try:
        receipt = await _send(pool, client, cfg, row)
        faults.point("control_plane.relay.after_send")
    except _UNDELIVERED as exc:
        log.warning("notification %s attempt %d failed: %s", nid, row["attempts"], exc)
        await outbox.failed(pool, ws, nid, f"{type(exc).__name__}: {exc}")
        return False
    await outbox.delivered(pool, ws, nid, receipt)
    return True


async def relay_once(pool: Pool, client: httpx.AsyncClient, cfg: RelayConfig) -> int:
    rows = await outbox.claim(pool, BATCH, cfg.backoff_seconds)
    results = await asyncio.gather(*(deliver(pool, client, cfg, r) for r in rows))
    return sum(results)


async def run_forever(pool: Pool, cfg: RelayConfig) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        while True:
            try:
                delivered = await relay_once(pool, client, cfg)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the database may be restarting
                log.warning("outbox relay failed, retrying: %s", exc)
                delivered = 0
            if not delivered:
                await asyncio.sleep(cfg.interval_seconds)
