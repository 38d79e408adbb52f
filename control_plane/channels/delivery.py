"""Sending one rendered notification through a workspace channel."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from email.message import EmailMessage
from typing import Any

import aiosmtplib
import httpx
from standardwebhooks.webhooks import Webhook

from control_plane.store.channels import Channel

SLACK_API = "https://slack.com/api"
LABELS = {
    "approve": "Approve",
    "reject": "Reject",
    "happened": "It happened",
    "not_happened": "It did not happen",
    "retry": "Send it again",
    "fail_run": "Stop the run",
}


class ChannelRefused(Exception):
    """The channel answered but did not take the message (Slack's ok: false)."""


def slack_blocks(text: str, actions: list[dict[str, str]]) -> list[dict[str, Any]]:
    """The message as Slack blocks: the text, then one button per action."""
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": text[:2900]}}
    ]
    if actions:
        blocks.append(
            {
                "type": "actions",
                "elements": [
                    {
                        "type": "button",
                        "action_id": a["action_id"],
                        "value": a["value"],
                        "text": {
                            "type": "plain_text",
                            "text": LABELS.get(a["action_id"], a["action_id"]),
                        },
                    }
                    for a in actions
                ],
            }
        )
    return blocks


async def slack_call(
    client: httpx.AsyncClient, channel: Channel, token: str, method: str, body: dict[str, Any]
) -> dict[str, Any]:
    """One Web API call (JSON body, bearer token); ChannelRefused unless ok."""
    base = str(channel.config.get("api_url") or SLACK_API).rstrip("/")
    resp = await client.post(
        f"{base}/{method}",
        json=body,
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json; charset=utf-8",
        },
    )
    resp.raise_for_status()
    answer = resp.json()
    if not answer.get("ok"):
        raise ChannelRefused(f"slack {method}: {answer.get('error', 'not ok')}")
    return dict(answer)


async def slack_post(
    client: httpx.AsyncClient, channel: Channel, token: str, chat: dict[str, Any]
) -> dict[str, Any]:
    """chat.postMessage of a rendered chat notification; the receipt is where it went."""
    body = {
        "channel": chat["channel"],
        "text": chat["text"],
        "blocks": slack_blocks(chat["text"], chat.get("actions") or []),
        "metadata": {
            "event_type": "agentrun_notification",
            "event_payload": {"notification_id": chat["notification_id"]},
        },
    }
    answer = await slack_call(client, channel, token, "chat.postMessage", body)
    return {"channel": answer["channel"], "ts": answer["ts"], "channel_id": str(channel.channel_id)}


async def slack_update(
    client: httpx.AsyncClient, channel: Channel, token: str, receipt: dict[str, Any], text: str
) -> None:
    """chat.update of a message already sent: the new text, no buttons left."""
    body = {
        "channel": receipt["channel"],
        "ts": receipt["ts"],
        "text": text,
        "blocks": slack_blocks(text, []),
    }
    await slack_call(client, channel, token, "chat.update", body)


async def email_send(
    channel: Channel, password: str, mail: dict[str, Any], notification_id: str
) -> dict[str, Any]:
    """One message over SMTP; its Message-ID is the notification's, so a resend is recognisable."""
    cfg = channel.config
    msg = EmailMessage()
    msg["From"] = cfg["sender"]
    msg["To"] = mail["to"]
    msg["Subject"] = mail["subject"]
    msg["Message-ID"] = f"<{notification_id}@agentrun>"
    msg.set_content(mail["body"])
    tls = cfg.get("tls") or "starttls"
    await aiosmtplib.send(
        msg,
        hostname=cfg["host"],
        port=int(cfg["port"]),
        username=cfg.get("username") or None,
        password=password or None,
        use_tls=tls == "tls",
        start_tls=tls == "starttls",
        timeout=10,
    )
    return {"message_id": msg["Message-ID"]}


def webhook_body(row: Any) -> str:
    """The Standard Webhooks payload: type, timestamp, data."""
    created = row["created_at"]
    return json.dumps(
        {
            "type": f"agentrun.{row['kind']}",
            "timestamp": created.astimezone(UTC).isoformat() if created else None,
            "data": json.loads(row["payload"]),
        },
        sort_keys=True,
    )


async def webhook_send(
    client: httpx.AsyncClient, channel: Channel, secret: str, row: Any
) -> dict[str, Any]:
    """POST the notification, signed for this attempt; the id is the row's, every attempt."""
    msg_id = f"msg_{row['notification_id'].hex}"
    body = webhook_body(row)
    now = datetime.now(UTC)
    signature = Webhook(secret).sign(msg_id, now, body)
    headers = {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signature,
    }
    resp = await client.post(str(channel.config["url"]), content=body.encode(), headers=headers)
    resp.raise_for_status()
    return {"status": resp.status_code, "webhook_id": msg_id}
