"""Capability tokens for approval links (only their hashes are stored) and signed-in approvers."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

from control_plane.api import validate
from control_plane.errors import InvalidArgument

TOKEN_BYTES = 32  # 256 random bits


def mint() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class BadBearer(Exception):
    """The bearer token is missing, malformed, forged or expired."""


@dataclass(frozen=True)
class Approver:
    user: str
    workspace_id: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign_bearer(key: bytes, user: str, workspace_id: str, ttl_seconds: int = 3600) -> str:
    """An HS256 JWT for a signed-in approver (what an identity provider would issue)."""
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    claims = {"sub": user, "ws": workspace_id, "exp": int(time.time()) + ttl_seconds}
    body = _b64(json.dumps(claims).encode())
    sig = hmac.new(key, f"{header}.{body}".encode(), hashlib.sha256).digest()
    return f"{header}.{body}.{_b64(sig)}"


def verify_bearer(key: bytes | None, token: str, now: float | None = None) -> Approver:
    """Check an HS256 bearer token: signature (constant time), algorithm and expiry."""
    if not key:
        raise BadBearer("signed-in approvals are not configured")
    try:
        header, body, sig = token.split(".")
        if validate.json_value("token", _unb64(header)).get("alg") != "HS256":
            raise BadBearer("unsupported token algorithm")
        expected = hmac.new(key, f"{header}.{body}".encode(), hashlib.sha256).digest()
        if not hmac.compare_digest(expected, _unb64(sig)):
            raise BadBearer("bad token signature")
        claims = validate.json_value("token", _unb64(body))
    except (ValueError, TypeError, AttributeError, InvalidArgument) as exc:
        raise BadBearer("malformed bearer token") from exc
    if claims.get("exp", 0) <= (now if now is not None else time.time()):
        raise BadBearer("bearer token expired")
    return Approver(user=str(claims.get("sub", "")), workspace_id=str(claims.get("ws", "")))
