"""Which channel an outbox row goes through, with its secret opened for the send."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from control_plane.channels import delivery, secrets
from control_plane.crypto.envelope import Envelope
from control_plane.store import channels
from control_plane.store.db import Pool


async def webhook(
    pool: Pool, envelope: Envelope | None, client: httpx.AsyncClient, row: Any
) -> dict[str, Any] | None:
    """Send a webhook row to its channel; a removed channel's rows are dropped (None)."""
    ws = row["workspace_id"]
    channel = await channels.get(pool, ws, uuid.UUID(row["recipient"]))
    if channel is None or envelope is None:
        return {"dropped": "channel removed"}
    secret = await secrets.open_secret(envelope, ws, channel.channel_id, channel.secret_sealed)
    return await delivery.webhook_send(client, channel, secret, row)


async def through_channel(
    pool: Pool,
    envelope: Envelope | None,
    client: httpx.AsyncClient,
    row: Any,
    rendered: dict[str, Any],
) -> dict[str, Any] | None:
    """Send a rendered mail or chat row through the workspace's channel of its kind;
    None when the workspace has none (the caller uses the deployment's notifier)."""
    kind = channels.FOR_ROW.get(row["channel"])
    if envelope is None or kind is None:
        return None
    ws = row["workspace_id"]
    channel = await channels.of_kind(pool, ws, kind)
    if channel is None:
        return None
    secret = await secrets.open_secret(envelope, ws, channel.channel_id, channel.secret_sealed)
    if kind == "slack":
        return await delivery.slack_post(client, channel, secret, rendered)
    return await delivery.email_send(channel, secret, rendered, str(row["notification_id"]))
