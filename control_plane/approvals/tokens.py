"""Capability tokens for approval links: 256 random bits, of which only the hash is stored.

(Signed-in approvers are people with an OpenID Connect ID token, verified by
`control_plane.auth.oidc`; there is no approver token of our own.)
"""

from __future__ import annotations

import hashlib
import secrets

TOKEN_BYTES = 32  # 256 random bits


def mint() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()
