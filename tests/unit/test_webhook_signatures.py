"""Signature schemes against the vendors' published test vectors, and the refusals.

GitHub, Slack and Standard Webhooks publish fixed vectors (secret, body,
expected signature); they are reproduced here exactly. Stripe publishes none,
so its cases are the ones Stripe's own SDK test suites check (stripe-python
tests/test_webhook.py, stripe-go webhook/client_test.go): the SDK's fixture
secret, a valid header with an extra unreadable v1, a header carrying the
signatures of a rolled key, a v0-only header, and the tolerance window.
"""

from __future__ import annotations

import hashlib
import hmac

import pytest

from control_plane.triggers.signatures import (
    Delivery,
    SignatureError,
    check_secret,
    generate_secret,
    sign,
    verify,
)

# https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries
GITHUB_SECRET = "It's a Secret to Everybody"
GITHUB_BODY = b"Hello, World!"
GITHUB_SIGNATURE = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"

# https://api.slack.com/authentication/verifying-requests-from-slack
SLACK_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
SLACK_TIMESTAMP = 1531420618
SLACK_BODY = (
    b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow"
    b"&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner"
    b"&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2F"
    b"commands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id="
    b"398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c"
)
SLACK_SIGNATURE = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"

# The Standard Webhooks specification's test vector (standard-webhooks/standard-webhooks).
STANDARD_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
STANDARD_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
STANDARD_TIMESTAMP = 1614265330
STANDARD_BODY = b'{"test": 2432232314}'
STANDARD_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

# Stripe's SDK fixtures.
STRIPE_SECRET = "whsec_test_secret"
STRIPE_BODY = b'{\n  "id": "evt_test_webhook",\n  "object": "event"\n}'
NOW = 1_700_000_000


def delivery(body: bytes, **headers: str) -> Delivery:
    return Delivery.of(body, {k.replace("_", "-"): v for k, v in headers.items()})


def refused(scheme, d, secrets, *, now=NOW, tolerance=300) -> str:
    with pytest.raises(SignatureError) as info:
        verify(scheme, d, secrets, now=now, tolerance=tolerance)
    return str(info.value)


# --- published vectors ------------------------------------------------------------------------


def test_github_published_vector():
    d = delivery(GITHUB_BODY, X_Hub_Signature_256=GITHUB_SIGNATURE)
    verify("github", d, [GITHUB_SECRET], now=NOW, tolerance=None)
    assert sign("github", GITHUB_SECRET, GITHUB_BODY, timestamp=0) == {
        "X-Hub-Signature-256": GITHUB_SIGNATURE
    }
    assert "does not match" in refused(
        "github", delivery(b"Hello, World?", X_Hub_Signature_256=GITHUB_SIGNATURE), [GITHUB_SECRET]
    )


def test_slack_published_vector_within_five_minutes():
    d = delivery(
        SLACK_BODY,
        X_Slack_Signature=SLACK_SIGNATURE,
        X_Slack_Request_Timestamp=str(SLACK_TIMESTAMP),
    )
    verify("slack", d, [SLACK_SECRET], now=SLACK_TIMESTAMP + 299, tolerance=300)
    assert sign("slack", SLACK_SECRET, SLACK_BODY, timestamp=SLACK_TIMESTAMP) == {
        "X-Slack-Signature": SLACK_SIGNATURE,
        "X-Slack-Request-Timestamp": str(SLACK_TIMESTAMP),
    }
    # The same captured request six minutes later is a replay.
    assert "tolerance" in refused("slack", d, [SLACK_SECRET], now=SLACK_TIMESTAMP + 360)


def test_standard_webhooks_published_vector():
    d = delivery(
        STANDARD_BODY,
        webhook_id=STANDARD_ID,
        webhook_timestamp=str(STANDARD_TIMESTAMP),
        webhook_signature=STANDARD_SIGNATURE,
    )
    verify("standard_webhooks", d, [STANDARD_SECRET], now=STANDARD_TIMESTAMP, tolerance=300)
    signed = sign(
        "standard_webhooks",
        STANDARD_SECRET,
        STANDARD_BODY,
        timestamp=STANDARD_TIMESTAMP,
        delivery_id=STANDARD_ID,
    )
    assert signed["webhook-signature"] == STANDARD_SIGNATURE
    # A sender may list several signatures (space-separated); one valid is enough.
    several = delivery(
        STANDARD_BODY,
        webhook_id=STANDARD_ID,
        webhook_timestamp=str(STANDARD_TIMESTAMP),
        webhook_signature=f"v1,bm9wZQ== v2,abc {STANDARD_SIGNATURE}",
    )
    verify("standard_webhooks", several, [STANDARD_SECRET], now=STANDARD_TIMESTAMP, tolerance=300)
    # Too old and too new are both refused.
    for now in (STANDARD_TIMESTAMP + 301, STANDARD_TIMESTAMP - 301):
        assert "tolerance" in refused("standard_webhooks", d, [STANDARD_SECRET], now=now)


# --- Stripe, as its SDK test suites check it ---------------------------------------------------


def stripe_header(timestamp: int, secret: str = STRIPE_SECRET, scheme: str = "v1") -> str:
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + STRIPE_BODY, hashlib.sha256)
    return f"t={timestamp},{scheme}={digest.hexdigest()}"


def test_stripe_valid_header_and_extra_unreadable_signature():
    header = stripe_header(NOW)
    assert sign("stripe", STRIPE_SECRET, STRIPE_BODY, timestamp=NOW) == {"Stripe-Signature": header}
    verify(
        "stripe",
        delivery(STRIPE_BODY, Stripe_Signature=header),
        [STRIPE_SECRET],
        now=NOW,
        tolerance=300,
    )
    with_bad = delivery(STRIPE_BODY, Stripe_Signature=header + ",v1=bad_signature")
    verify("stripe", with_bad, [STRIPE_SECRET], now=NOW, tolerance=300)


def test_stripe_several_v1_entries_while_stripe_rolls_its_key():
    rolled = stripe_header(NOW, STRIPE_SECRET + "_rolled_key").split("v1=")[1]
    header = stripe_header(NOW) + f",v1={rolled}"
    d = delivery(STRIPE_BODY, Stripe_Signature=header)
    verify("stripe", d, [STRIPE_SECRET], now=NOW, tolerance=300)
    verify("stripe", d, [STRIPE_SECRET + "_rolled_key"], now=NOW, tolerance=300)


def test_stripe_refusals():
    v0_only = delivery(STRIPE_BODY, Stripe_Signature=stripe_header(NOW, scheme="v0"))
    assert "no v1 signature" in refused("stripe", v0_only, [STRIPE_SECRET])
    fake = delivery(STRIPE_BODY, Stripe_Signature=f"t={NOW},v1=deadbeef")
    assert "does not match" in refused("stripe", fake, [STRIPE_SECRET])
    malformed = delivery(STRIPE_BODY, Stripe_Signature="i'm not even a real signature header")
    assert "no timestamp" in refused("stripe", malformed, [STRIPE_SECRET])
    old = delivery(STRIPE_BODY, Stripe_Signature=stripe_header(NOW - 15))
    assert "tolerance" in refused("stripe", old, [STRIPE_SECRET], tolerance=10)
    verify("stripe", old, [STRIPE_SECRET], now=NOW, tolerance=20)
    # The 300 s default: just inside passes, just outside does not.
    verify(
        "stripe",
        delivery(STRIPE_BODY, Stripe_Signature=stripe_header(NOW - 300)),
        [STRIPE_SECRET],
        now=NOW,
        tolerance=300,
    )
    stale = delivery(STRIPE_BODY, Stripe_Signature=stripe_header(NOW - 301))
    assert "tolerance" in refused("stripe", stale, [STRIPE_SECRET])


def test_stripe_documentation_header_shape_with_another_secret_is_forged():
    # docs.stripe.com/webhooks/signatures shows this header (without its secret).
    header = (
        "t=1492774577,v1=5257a869e7ecebeda32affa62cdca3fa51cad7e77a0e56ff536d0ce8e108d8bd,"
        "v0=6ffbb59b2300aae63f272406069a9788598b792a944a07aba816edb039989a39"
    )
    d = delivery(STRIPE_BODY, Stripe_Signature=header)
    assert "does not match" in refused("stripe", d, [STRIPE_SECRET], now=1492774577)


# --- rotation, forgery, replay -----------------------------------------------------------------


@pytest.mark.parametrize(
    "scheme", ["hmac_sha256", "stripe", "slack", "github", "standard_webhooks"]
)
def test_two_active_secrets_during_rotation(scheme):
    old, new, other = (generate_secret(scheme) for _ in range(3))
    body = b'{"id": "evt_1"}'
    for secret in (old, new):
        headers = sign(scheme, secret, body, timestamp=NOW, delivery_id="d-1")
        verify(scheme, Delivery.of(body, headers), [new, old], now=NOW, tolerance=300)
    forged = sign(scheme, other, body, timestamp=NOW, delivery_id="d-1")
    assert "does not match" in refused(scheme, Delivery.of(body, forged), [new, old])
    # Rotated out: only the new secret is active now.
    rotated_out = sign(scheme, old, body, timestamp=NOW, delivery_id="d-1")
    assert "does not match" in refused(scheme, Delivery.of(body, rotated_out), [new])


@pytest.mark.parametrize(
    "scheme", ["hmac_sha256", "stripe", "slack", "github", "standard_webhooks"]
)
def test_a_tampered_body_is_refused(scheme):
    secret = generate_secret(scheme)
    headers = sign(scheme, secret, b'{"amount": 100}', timestamp=NOW, delivery_id="d-1")
    tampered = Delivery.of(b'{"amount": 999}', headers)
    assert "does not match" in refused(scheme, tampered, [secret])


def test_generic_hmac_timed_and_untimed():
    secret = generate_secret("hmac_sha256")
    body = b"{}"
    timed = sign("hmac_sha256", secret, body, timestamp=NOW)
    verify("hmac_sha256", Delivery.of(body, timed), [secret], now=NOW + 299, tolerance=300)
    assert "tolerance" in refused("hmac_sha256", Delivery.of(body, timed), [secret], now=NOW + 301)
    # Untimed signs the body alone; a timed trigger refuses it (no timestamp header).
    untimed = sign("hmac_sha256", secret, body, timestamp=NOW, untimed=True)
    verify("hmac_sha256", Delivery.of(body, untimed), [secret], now=NOW + 10**6, tolerance=None)
    assert "missing header X-Webhook-Timestamp" in refused(
        "hmac_sha256", Delivery.of(body, untimed), [secret]
    )


def test_missing_headers_and_no_secret_are_refused_by_name():
    assert refused("github", delivery(b"{}"), ["x" * 16]) == "missing header X-Hub-Signature-256"
    assert refused("slack", delivery(b"{}", X_Slack_Signature="v0=00"), ["x" * 16]) == (
        "missing header X-Slack-Request-Timestamp"
    )
    assert refused("github", delivery(b"{}", X_Hub_Signature_256="sha256=00"), []) == (
        "the trigger has no active secret"
    )


def test_errors_never_carry_the_secret_or_the_expected_signature():
    secret = generate_secret("github")
    expected = sign("github", secret, b"{}", timestamp=0)["X-Hub-Signature-256"]
    message = refused("github", delivery(b"{}", X_Hub_Signature_256="sha256=00"), [secret])
    assert secret not in message and expected.split("=")[1] not in message


def test_secrets_are_checked_for_their_scheme():
    assert generate_secret("standard_webhooks").startswith("whsec_")
    check_secret("standard_webhooks", STANDARD_SECRET)
    with pytest.raises(ValueError, match="base64"):
        check_secret("standard_webhooks", "whsec_not*base64!")
    with pytest.raises(ValueError, match="8-512"):
        check_secret("github", "short")
    check_secret("slack", SLACK_SECRET)
