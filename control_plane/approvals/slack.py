"""Slack request signatures: v0 HMAC-SHA256 over `v0:timestamp:body`, 5-minute window."""

from __future__ import annotations

import hashlib
import hmac
import time

TOLERANCE_SECONDS = 300


class BadSignature(Exception):
    """Missing, stale or forged signature."""


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret, base, hashlib.sha256).hexdigest()


def verify(
    secret: bytes | None, timestamp: str | None, signature: str | None, body: bytes,
    now: float | None = None,
) -> None:  # fmt: skip
    """Raise BadSignature unless the request is Slack's, signed within the window."""
    if not secret:
        raise BadSignature("Slack signing secret is not configured")
    if not timestamp or not signature:
        raise BadSignature("missing X-Slack-Request-Timestamp or X-Slack-Signature")
    try:
        age = abs((now if now is not None else time.time()) - int(timestamp))
    except ValueError:
        raise BadSignature("malformed X-Slack-Request-Timestamp") from None
    if age > TOLERANCE_SECONDS:
        raise BadSignature(f"request timestamp is {int(age)} s old (limit {TOLERANCE_SECONDS} s)")
    if not hmac.compare_digest(sign(secret, timestamp, body), signature):
        raise BadSignature("signature does not match")
