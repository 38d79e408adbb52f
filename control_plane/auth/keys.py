"""API key strings: generated with 256 bits of entropy, shown once, stored only as a hash.

A key reads `agr_<kind>_<key_id>_<secret>`: `kind` is `ws` (a workspace key),
`ex` (an executor credential) or `pa` (a platform admin key); `key_id` is the
public, indexed part (it appears in listings and the audit log); `secret` is
43 url-safe characters. The database keeps `key_id` and SHA-256(secret):
with this much entropy a slow password hash buys nothing, and a lookup costs
one index probe plus one constant-time compare.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

KINDS = {"ws": "workspace", "ex": "executor", "pa": "platform"}
PREFIXES = {v: k for k, v in KINDS.items()}
_KEY = re.compile(
    r"^agr_(?P<kind>ws|ex|pa)_(?P<key_id>[a-z0-9]{16})_(?P<secret>[A-Za-z0-9_-]{43})$"
)


@dataclass(frozen=True)
class ParsedKey:
    kind: str  # workspace, executor or platform
    key_id: str
    secret: str

    @property
    def digest(self) -> bytes:
        return digest(self.secret)


@dataclass(frozen=True)
class NewKey:
    """A freshly generated key: `text` is shown once; only `key_id` and `digest` are stored."""

    kind: str
    key_id: str
    text: str
    digest: bytes

    def __repr__(self) -> str:  # never print the secret by accident
        return f"NewKey(kind={self.kind!r}, key_id={self.key_id!r})"


def digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def generate(kind: str) -> NewKey:
    """A new key of `kind` (workspace, executor or platform)."""
    key_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    return NewKey(kind, key_id, f"agr_{PREFIXES[kind]}_{key_id}_{secret}", digest(secret))


def parse(text: str) -> ParsedKey | None:
    """The parts of a key string, or None when it is not shaped like one of ours."""
    match = _KEY.match(text)
    if match is None:
        return None
    return ParsedKey(KINDS[match["kind"]], match["key_id"], match["secret"])


def matches(parsed: ParsedKey, stored_digest: bytes) -> bool:
    """Constant-time comparison of a presented key with the stored hash."""
    return hmac.compare_digest(parsed.digest, bytes(stored_digest))
