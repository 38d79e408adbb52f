"""Sealing and opening a channel's secret (bound to its workspace and channel id)."""

from __future__ import annotations

import uuid

from control_plane.crypto.envelope import CHANNEL_SECRET, Envelope


async def seal(envelope: Envelope, workspace_id: str, channel_id: uuid.UUID, secret: str) -> bytes:
    return await envelope.seal(workspace_id, CHANNEL_SECRET, str(channel_id), secret.encode())


async def open_secret(
    envelope: Envelope, workspace_id: str, channel_id: uuid.UUID, sealed: bytes | None
) -> str:
    if not sealed:
        return ""
    opened = await envelope.open(workspace_id, CHANNEL_SECRET, str(channel_id), sealed)
    return opened.decode()
