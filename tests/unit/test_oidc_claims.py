"""The pure parts of ID-token verification: headers, JWKS parsing, claims, reasons."""

from __future__ import annotations

import jwt
import pytest

from control_plane.auth import oidc
from control_plane.ground.errors import Unauthenticated
from sandbox.idp import SigningKey

CLAIMS = {
    "iss": "https://idp",
    "sub": "s1",
    "aud": "agentrun",
    "email": "Ada@Example.com",
    "email_verified": True,
}


def test_api_keys_are_not_mistaken_for_id_tokens():
    assert oidc.looks_like_jwt("a.b.c")
    assert not oidc.looks_like_jwt("agr_ws_0123456789abcdef_" + "x" * 43)
    assert not oidc.looks_like_jwt("a.b")


@pytest.mark.parametrize("alg", ["none", "HS256", "HS512", "RS512", "PS256", None, "ES384"])
def test_only_rs256_and_es256_headers_are_accepted(alg):
    with pytest.raises(Unauthenticated, match="algorithm"):
        oidc.check_header({"alg": alg, "kid": "k"})


def test_a_header_must_name_its_key():
    assert oidc.check_header({"alg": "ES256", "kid": "k1"}) == ("ES256", "k1")
    for header in ({"alg": "RS256"}, {"alg": "RS256", "kid": ""}, {"alg": "RS256", "kid": 7}, []):
        with pytest.raises(Unauthenticated):
            oidc.check_header(header)


def test_jwks_keeps_only_signing_keys_whose_alg_fits_their_type():
    rsa, ec = SigningKey.new("RS256").public_jwk(), SigningKey.new("ES256").public_jwk()
    mislabelled = {**rsa, "kid": "rsa-as-es", "alg": "ES256"}
    hmac_key = {"kty": "oct", "kid": "h", "k": "c2VjcmV0", "alg": "HS256"}
    encryption = {**ec, "kid": "enc", "use": "enc"}
    no_alg = {k: v for k, v in rsa.items() if k != "alg"} | {"kid": "bare"}
    broken = {**rsa, "kid": "broken", "n": "!!"}
    doc = {"keys": [rsa, ec, mislabelled, hmac_key, encryption, no_alg, broken, "junk"]}
    keys = oidc.parse_jwks(doc)
    assert set(keys) == {rsa["kid"], ec["kid"], "bare"}
    assert (keys[rsa["kid"]].alg, keys[ec["kid"]].alg, keys["bare"].alg) == (
        "RS256",
        "ES256",
        "RS256",
    )
    assert oidc.parse_jwks({"keys": "nope"}) == {} and oidc.parse_jwks([]) == {}


def test_jwks_is_bounded():
    key = SigningKey.new("ES256").public_jwk()
    doc = {"keys": [{**key, "kid": f"k{i}"} for i in range(100)]}
    assert len(oidc.parse_jwks(doc)) == oidc.MAX_KEYS


def test_the_person_is_the_verified_email():
    person = oidc.person_of(CLAIMS, "agentrun")
    assert person == oidc.VerifiedPerson("https://idp", "s1", "ada@example.com")


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"email_verified": False}, "not verified"),
        ({"email_verified": "true"}, "not verified"),
        ({"email": None}, "no email"),
        ({"email": "not-an-address"}, "no email"),
        ({"sub": ""}, "no subject"),
        ({"aud": ["agentrun", "other"]}, "azp"),
    ],
)
def test_claims_without_a_verified_person_are_refused(change, reason):
    with pytest.raises(Unauthenticated, match=reason):
        oidc.person_of({**CLAIMS, **change}, "agentrun")
    assert oidc.person_of({**CLAIMS, "aud": ["agentrun", "x"], "azp": "agentrun"}, "agentrun")


def test_reasons_never_quote_the_input():
    assert oidc.reason_for(jwt.ExpiredSignatureError("eyJsecret")) == "the ID token has expired"
    assert oidc.reason_for(jwt.DecodeError("eyJsecret")) == "malformed ID token"
    assert (
        oidc.reason_for(jwt.MissingRequiredClaimError("exp")) == "the ID token lacks the exp claim"
    )
