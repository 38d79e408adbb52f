"""Messages already sent are edited when what they asked about closes (issue 43).

A run that ends while it waits closes its approvals (migration 0042's trigger), which
queues one `approval_closed` notification per approval that was posted to chat. The relay
delivers it as a chat.update of every Slack message the approval had (request, reminders,
escalation; their receipts hold channel and ts): the buttons go, the text says why. A
message still to be sent makes this attempt fail, so the edit comes after the post; a
request not yet sent when its approval closed is not sent at all (relay.py).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx

from control_plane.channels import delivery, secrets
from control_plane.crypto.envelope import Envelope
from control_plane.store import channels, outbox
from control_plane.store.db import Pool

KIND = "approval_closed"


class NotYetSent(delivery.ChannelRefused):
    """A message to edit is still in the outbox: try again after it went."""


def text(payload: dict[str, Any]) -> str:
    return (
        f"Closed: agent run {payload['run_id']} no longer waits for this approval of "
        f"{payload['tool']} ({payload['reason']}). Nothing was sent; nobody needs to decide."
    )


async def edit_sent(
    pool: Pool, envelope: Envelope | None, client: httpx.AsyncClient, row: Any
) -> dict[str, Any]:
    """chat.update of each Slack message the closed approval had; the receipt counts them."""
    ws = row["workspace_id"]
    payload = json.loads(row["payload"])
    sent = await outbox.chat_for_approval(pool, ws, str(payload["approval_id"]))
    if any(r["delivered_at"] is None for r in sent):
        raise NotYetSent(f"approval {payload['approval_id']} has a message still to be sent")
    edited = 0
    for r in sent:
        receipt = json.loads(r["receipt"]) if r["receipt"] else {}
        if "ts" not in receipt or envelope is None:
            continue  # not a Slack message (the deployment's notifier, or never sent)
        channel = await channels.get(pool, ws, uuid.UUID(receipt["channel_id"]))
        if channel is None:
            continue  # the channel was removed since
        token = await secrets.open_secret(envelope, ws, channel.channel_id, channel.secret_sealed)
        await delivery.slack_update(client, channel, token, receipt, text(payload))
        edited += 1
    return {"edited": edited}
