"""Alert rules: a breach of a workspace's rule fires once through one of its channels.

A loop evaluates every rule on the database clock (store/sql/alerts.sql): a failure rate
over a window (at least `min_finished` runs of an agent, or of all, finished in the last
`window_seconds`, at least `threshold` of them failed) or runs stuck on a person (waiting on
an approval, a question or an unknown outcome longer than `waiting_seconds`). A breached rule
that has not fired for this breach fires: one guarded update sets `fired_at` (and clears
`resolved_at`) in the transaction that queues its notification in the outbox, so replicas
evaluating together fire it once, and the relay delivers it at least once under one id
(a webhook channel: signed, Standard Webhooks; slack and email: a message to the rule's
recipient). While the breach lasts nothing more is sent; when the condition no longer holds
`resolved_at` is set, and the next breach fires again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

from control_plane.store import alerts as store
from control_plane.store import outbox
from control_plane.store.db import Pool, Record, transaction

log = logging.getLogger(__name__)

KIND = "alert_fired"
BATCH = 500
# The outbox channel a rule's notification takes, by its channel's kind.
OUTBOX_CHANNEL = {"webhook": "webhook", "slack": "chat", "email": "mail"}


def summary(rule: Record) -> str:
    """What the rule saw, in a sentence (no run content: ids, counts and names only)."""
    scope = f"agent {rule['agent_id']}" if rule["agent_id"] else "all agents"
    if rule["kind"] == "failure_rate":
        return (
            f"alert {rule['name']}: {rule['failed']} of {rule['finished']} runs of {scope} "
            f"failed in the last {rule['window_seconds']}s "
            f"(threshold {rule['threshold']:.0%} of at least {rule['min_finished']})"
        )
    return (
        f"alert {rule['name']}: {rule['stuck']} run(s) of {scope} waiting on a person "
        f"longer than {rule['waiting_seconds']}s"
    )


def payload(rule: Record, fired: Record) -> dict[str, Any]:
    data: dict[str, Any] = {
        "kind": KIND,
        "rule": rule["name"],
        "condition": rule["kind"],
        "agent_id": rule["agent_id"],
        "fired_at": fired["fired_at"].isoformat(),
        "fire_count": fired["fire_count"],
        "summary": summary(rule),
    }
    if rule["kind"] == "failure_rate":
        data.update(finished=rule["finished"], failed=rule["failed"])
    else:
        data.update(stuck=rule["stuck"])
    return data


async def _fire(pool: Pool, rule: Record) -> bool:
    ws, name = rule["workspace_id"], rule["name"]
    async with transaction(pool) as conn:
        fired = await store.fire(conn, ws, name)
        if fired is None:
            return False
        channel = OUTBOX_CHANNEL[rule["channel_kind"]]
        recipient = str(rule["channel_id"]) if channel == "webhook" else rule["recipient"]
        # One id per breach: a relay that sends twice sends the same notification.
        nid = uuid.uuid5(uuid.NAMESPACE_URL, f"agentrun:alert:{ws}:{name}:{fired['fire_count']}")
        note = outbox.Notification(ws, KIND, channel, recipient, payload(rule, fired), nid)
        await outbox.insert(conn, note)
    log.info("%s", summary(rule))
    return True


async def evaluate_once(pool: Pool) -> int:
    """Evaluate every rule; fire the newly breached, resolve the no longer breached.
    Returns how many fired."""
    fired = 0
    for rule in await store.evaluate(pool, BATCH):
        if rule["breached"]:
            if rule["fired_at"] is None or rule["resolved_at"] is not None:
                fired += int(await _fire(pool, rule))
        elif rule["fired_at"] is not None and rule["resolved_at"] is None:
            await store.resolve(pool, rule["workspace_id"], rule["name"])
    return fired


def mail_request(row: Any) -> tuple[str, dict[str, Any]]:
    """The message of an alert for a slack or email channel (the relay's rendering)."""
    data = json.loads(row["payload"])
    text = str(data.get("summary", "an alert fired"))
    if row["channel"] == "mail":
        subject = f"Alert: {data.get('rule', '')}"
        return "/mail/send", {"to": row["recipient"], "subject": subject, "body": text}
    return "/chat/messages", {
        "channel": row["recipient"],
        "text": text,
        "notification_id": str(row["notification_id"]),
    }


async def run_forever(pool: Pool, interval: float) -> None:
    while True:
        try:
            await evaluate_once(pool)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the database may be restarting
            log.warning("alert rules evaluation failed, retrying: %s", exc)
        await asyncio.sleep(interval)
