"""Webhook signature schemes: verify a delivery against the trigger's active secrets.

Every scheme is an HMAC-SHA256 keyed with the trigger's secret and compared in
constant time (`hmac.compare_digest`). What differs is the header, the bytes
signed, and whether a signed timestamp bounds replays:

| scheme | header | signed bytes | window |
|---|---|---|---|
| hmac_sha256 | X-Webhook-Signature: sha256=<hex> | "<X-Webhook-Timestamp>.<body>" (or the body, untimed) | 300 s |
| stripe | Stripe-Signature: t=<ts>,v1=<hex>,v1=… | "<t>.<body>" | 300 s |
| slack | X-Slack-Signature: v0=<hex> | "v0:<X-Slack-Request-Timestamp>:<body>" | 300 s |
| github | X-Hub-Signature-256: sha256=<hex> | the body | none |
| standard_webhooks | webhook-signature: v1,<b64> v1,<b64> | "<webhook-id>.<webhook-timestamp>.<body>" | 300 s |

A delivery passes when any signature it carries matches any active secret:
two secrets are active while a sender rotates, and Stripe and Standard
Webhooks senders may themselves send several signatures. Errors say what was
wrong in terms safe to show the sender; they never include a secret or the
expected signature.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets as random_secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

DEFAULT_TOLERANCE_SECONDS = 300


class SignatureError(Exception):
    """The delivery is not signed by an active secret, or not within the replay window."""


@dataclass(frozen=True)
class Delivery:
    """The raw body and headers of one HTTP delivery (header names in lower case)."""

    body: bytes
    headers: Mapping[str, str]

    @classmethod
    def of(cls, body: bytes, headers: Mapping[str, str]) -> Delivery:
        return cls(body, {k.lower(): v for k, v in headers.items()})

    def header(self, name: str) -> str:
        value = self.headers.get(name.lower(), "").strip()
        if not value:
            raise SignatureError(f"missing header {name}")
        return value


def _hmac(key: bytes, *parts: bytes) -> bytes:
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        mac.update(part)
    return mac.digest()


def _matches(expected: Sequence[bytes], given: Sequence[bytes]) -> bool:
    """Constant-time comparison of every expected digest with every given one."""
    found = False
    for want in expected:
        for got in given:
            # No early exit: the time taken does not depend on which one matched.
            found |= hmac.compare_digest(want, got)
    return found


def _timestamp(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise SignatureError("the signature timestamp is not an integer") from None


def _check_window(timestamp: int, now: float, tolerance: int | None) -> None:
    if tolerance is not None and abs(now - timestamp) > tolerance:
        raise SignatureError(f"the signature timestamp is outside the {tolerance} s tolerance")


def _hex_signatures(values: Sequence[str], prefix: str) -> list[bytes]:
    """The digests of `prefix<hex>` entries; others are ignored (unknown versions)."""
    out = []
    for value in values:
        if value.startswith(prefix):
            try:
                out.append(bytes.fromhex(value[len(prefix) :]))
            except ValueError:
                continue  # an unreadable entry is ignored, as the vendors' libraries do
    return out


# --- the schemes ------------------------------------------------------------------------------


def _verify_hmac(d: Delivery, keys: list[bytes], now: float, tolerance: int | None) -> None:
    given = _hex_signatures(d.header("X-Webhook-Signature").replace(",", " ").split(), "sha256=")
    if tolerance is None:
        expected = [_hmac(k, d.body) for k in keys]
    else:
        ts = d.header("X-Webhook-Timestamp")
        expected = [_hmac(k, ts.encode(), b".", d.body) for k in keys]
    if not _matches(expected, given):
        raise SignatureError("signature does not match")
    if tolerance is not None:
        _check_window(_timestamp(ts), now, tolerance)


def _verify_stripe(d: Delivery, keys: list[bytes], now: float, tolerance: int | None) -> None:
    pairs = [item.split("=", 1) for item in d.header("Stripe-Signature").split(",") if "=" in item]
    stamps = [v.strip() for k, v in pairs if k.strip() == "t"]
    given = _hex_signatures([v.strip() for k, v in pairs if k.strip() == "v1"], "")
    if not stamps or not given:
        raise SignatureError("Stripe-Signature has no timestamp or no v1 signature")
    expected = [_hmac(k, stamps[0].encode(), b".", d.body) for k in keys]
    if not _matches(expected, given):
        raise SignatureError("signature does not match")
    _check_window(_timestamp(stamps[0]), now, tolerance)


def _verify_slack(d: Delivery, keys: list[bytes], now: float, tolerance: int | None) -> None:
    ts = d.header("X-Slack-Request-Timestamp")
    given = _hex_signatures([d.header("X-Slack-Signature")], "v0=")
    expected = [_hmac(k, b"v0:", ts.encode(), b":", d.body) for k in keys]
    if not _matches(expected, given):
        raise SignatureError("signature does not match")
    _check_window(_timestamp(ts), now, tolerance)


def _verify_github(d: Delivery, keys: list[bytes], now: float, tolerance: int | None) -> None:
    given = _hex_signatures([d.header("X-Hub-Signature-256")], "sha256=")
    if not _matches([_hmac(k, d.body) for k in keys], given):
        raise SignatureError("signature does not match")


def _verify_standard(d: Delivery, keys: list[bytes], now: float, tolerance: int | None) -> None:
    msg_id, ts = d.header("webhook-id"), d.header("webhook-timestamp")
    given = []
    for entry in d.header("webhook-signature").split():
        version, _, sig = entry.partition(",")
        if version == "v1":
            try:
                given.append(base64.b64decode(sig, validate=True))
            except (binascii.Error, ValueError):
                continue
    expected = [_hmac(k, msg_id.encode(), b".", ts.encode(), b".", d.body) for k in keys]
    if not _matches(expected, given):
        raise SignatureError("signature does not match")
    _check_window(_timestamp(ts), now, tolerance)


def standard_webhooks_key(secret: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret: base64 after the optional `whsec_`."""
    raw = secret.removeprefix("whsec_")
    try:
        return base64.b64decode(raw + "=" * (-len(raw) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(
            "a Standard Webhooks secret is base64, optionally after 'whsec_'"
        ) from None


Verifier = Callable[[Delivery, list[bytes], float, "int | None"], None]


@dataclass(frozen=True)
class Scheme:
    """One signature scheme and its vendor defaults."""

    name: str
    verify: Verifier
    default_tolerance: int | None
    # Where a delivery's stable id is when the trigger names none: headers, then body fields.
    dedupe_headers: tuple[str, ...] = ()
    dedupe_fields: tuple[str, ...] = ()

    def key(self, secret: str) -> bytes:
        if self.name == "standard_webhooks":
            return standard_webhooks_key(secret)
        return secret.encode()


SCHEMES: dict[str, Scheme] = {
    s.name: s
    for s in (
        Scheme("hmac_sha256", _verify_hmac, DEFAULT_TOLERANCE_SECONDS, ("x-webhook-id",)),
        Scheme("stripe", _verify_stripe, 300, dedupe_fields=("id",)),
        Scheme("slack", _verify_slack, 300, dedupe_fields=("event_id", "trigger_id")),
        Scheme("github", _verify_github, None, ("x-github-delivery",)),
        Scheme("standard_webhooks", _verify_standard, 300, ("webhook-id",)),
    )
}


def verify(
    scheme: str,
    delivery: Delivery,
    secrets: Sequence[str],
    *,
    now: float,
    tolerance: int | None,
) -> None:
    """Raise SignatureError unless one of the delivery's signatures matches one of `secrets`.

    `tolerance` is the replay window in seconds (None: no timestamp is checked).
    """
    spec = SCHEMES[scheme]
    keys = []
    for secret in secrets:
        try:
            keys.append(spec.key(secret))
        except ValueError:
            continue  # validated when stored; never let one bad secret hide the other
    if not keys:
        raise SignatureError("the trigger has no active secret")
    spec.verify(delivery, keys, now, tolerance)


def check_secret(scheme: str, secret: str) -> None:
    """Raise ValueError when `secret` cannot key `scheme` (or is too short to be one)."""
    if len(secret) < 8 or len(secret) > 512:
        raise ValueError("must be 8-512 characters")
    SCHEMES[scheme].key(secret)


def generate_secret(scheme: str) -> str:
    """A fresh secret in the scheme's usual form (256 random bits)."""
    raw = random_secrets.token_bytes(32)
    if scheme == "standard_webhooks":
        return "whsec_" + base64.b64encode(raw).decode()
    return "whsec_" + raw.hex()


# --- signing (what a sender does; tests and `agentrun triggers` use it) ------------------------


def sign(
    scheme: str,
    secret: str,
    body: bytes,
    *,
    timestamp: int,
    delivery_id: str = "",
    untimed: bool = False,
) -> dict[str, str]:
    """The headers a sender using `scheme` puts on `body`."""
    key = SCHEMES[scheme].key(secret)
    ts = str(timestamp).encode()
    if scheme == "hmac_sha256":
        if untimed:
            return {"X-Webhook-Signature": "sha256=" + _hmac(key, body).hex()}
        digest = _hmac(key, ts, b".", body).hex()
        return {"X-Webhook-Signature": f"sha256={digest}", "X-Webhook-Timestamp": ts.decode()}
    if scheme == "stripe":
        return {"Stripe-Signature": f"t={timestamp},v1={_hmac(key, ts, b'.', body).hex()}"}
    if scheme == "slack":
        digest = _hmac(key, b"v0:", ts, b":", body).hex()
        return {"X-Slack-Signature": f"v0={digest}", "X-Slack-Request-Timestamp": ts.decode()}
    if scheme == "github":
        return {"X-Hub-Signature-256": "sha256=" + _hmac(key, body).hex()}
    mac = _hmac(key, delivery_id.encode(), b".", ts, b".", body)
    return {
        "webhook-id": delivery_id,
        "webhook-timestamp": ts.decode(),
        "webhook-signature": "v1," + base64.b64encode(mac).decode(),
    }
