"""The sandbox IdP's authorization-code flow: a code is good once, for its client, with PKCE."""

from __future__ import annotations

import warnings

import jwt
import pytest
from starlette.exceptions import StarletteDeprecationWarning

from sandbox.idp import (
    BadTokenRequest,
    IdentityProvider,
    create_app,
    grant_code,
    pkce_challenge,
    redeem_code,
)

ISSUER = "http://idp.test"


def granted(idp: IdentityProvider, verifier: str = "v" * 43) -> tuple[str, dict[str, str]]:
    form = {
        "email": "ada@example.com",
        "client_id": "agentrun",
        "state": "s",
        "nonce": "n1",
        "redirect_uri": "http://cp.test/console/callback",
        "code_challenge": pkce_challenge(verifier),
    }
    code = grant_code(idp, form)
    return code, {
        "code": code,
        "client_id": "agentrun",
        "code_verifier": verifier,
        "redirect_uri": form["redirect_uri"],
    }


def test_a_code_gives_the_users_id_token_with_the_nonce_once() -> None:
    idp = IdentityProvider(ISSUER)
    _, exchange = granted(idp)
    claims = jwt.decode(redeem_code(idp, exchange, ISSUER), options={"verify_signature": False})
    assert (claims["email"], claims["aud"], claims["nonce"]) == (
        "ada@example.com",
        "agentrun",
        "n1",
    )
    with pytest.raises(BadTokenRequest, match="unknown, used or expired"):
        redeem_code(idp, exchange, ISSUER)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"code_verifier": "w" * 43}, "code_verifier"),
        ({"client_id": "someone-else"}, "client_id"),
        ({"redirect_uri": "http://evil.test/cb"}, "redirect_uri"),
        ({"code": "made-up"}, "unknown"),
    ],
)
def test_a_code_is_refused_for_another_verifier_client_or_redirect(change, words) -> None:
    idp = IdentityProvider(ISSUER)
    _, exchange = granted(idp)
    with pytest.raises(BadTokenRequest, match=words):
        redeem_code(idp, {**exchange, **change}, ISSUER)


def test_a_sign_in_without_pkce_or_an_email_gets_no_code() -> None:
    idp = IdentityProvider(ISSUER)
    base = {
        "email": "ada@example.com",
        "client_id": "agentrun",
        "redirect_uri": "http://cp.test/cb",
        "code_challenge": "c",
    }
    for missing, words in (("code_challenge", "PKCE"), ("email", "email")):
        with pytest.raises(BadTokenRequest, match=words):
            grant_code(idp, {k: v for k, v in base.items() if k != missing})
    assert idp.codes == {}


def test_a_challenge_or_verifier_in_any_characters_is_refused_not_a_crash() -> None:
    """compare_digest raises TypeError for non-ASCII text: the exchange must say no instead."""
    idp = IdentityProvider(ISSUER)
    form = {
        "email": "ada@example.com",
        "client_id": "agentrun",
        "redirect_uri": "http://cp.test/cb",
        "code_challenge": "défi-ü",
    }
    code = grant_code(idp, form)
    with pytest.raises(BadTokenRequest, match="code_verifier"):
        redeem_code(
            idp,
            {
                "code": code,
                "client_id": "agentrun",
                "redirect_uri": form["redirect_uri"],
                "code_verifier": "vérifier",
            },
            ISSUER,
        )


def test_a_malformed_rotation_is_refused_and_keeps_the_keys() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StarletteDeprecationWarning)
        from starlette.testclient import TestClient
    client = TestClient(create_app(ISSUER))
    published = client.get("/jwks.json").json()
    for body in (
        b"\xff\xfe",
        b"not json",
        b"[]",
        b"null",
        b'{"alg": ["RS256"]}',
        b'{"grace_seconds": "soon"}',
        b'{"grace_seconds": -1}',
    ):
        refused = client.post("/_sandbox/rotate", content=body)
        assert refused.status_code == 400 and refused.json()["error"], body
    assert client.get("/jwks.json").json() == published
    assert client.post("/_sandbox/rotate", json={"grace_seconds": 0}).status_code == 200
