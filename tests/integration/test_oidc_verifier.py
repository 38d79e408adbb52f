"""ID-token verification against the sandbox OpenID provider over real HTTP."""

from __future__ import annotations

import asyncio

import pytest

from control_plane.auth.oidc import OidcVerifier, VerifiedPerson
from control_plane.ground.errors import Unauthenticated
from tests.harness.idp import id_token, rotate, stats
from tests.harness.processes import start_sandbox

ADA = "ada@example.com"


@pytest.fixture
async def verifier(sandbox_idp):
    v = OidcVerifier(sandbox_idp.url, "agentrun")
    yield v
    await v.close()


@pytest.fixture
def own_idp(processes):
    """An IdP of this test alone (rotation changes its keys)."""
    return start_sandbox(processes, "idp")


@pytest.mark.parametrize("alg", ["RS256", "ES256"])
async def test_a_token_of_the_issuer_names_a_verified_person(verifier, sandbox_idp, alg):
    token = await id_token(sandbox_idp.url, "Ada@Example.com", alg=alg, subject="u-1")
    person = await verifier.verify(token)
    assert person == VerifiedPerson(sandbox_idp.url, "u-1", ADA)


@pytest.mark.parametrize(
    "claims, reason",
    [
        ({"audience": "someone-else"}, "another audience"),
        ({"issuer": "http://evil.example"}, "another issuer"),
        ({"expires_in": -120}, "expired"),
        ({"not_before": 600}, "not valid yet"),
        ({"email_verified": False}, "not verified"),
        ({"forge": "none"}, "algorithm"),
        ({"forge": "hs256"}, "algorithm"),
        ({"forge": "wrong_key"}, "signature does not verify"),
        ({"forge": "unknown_key"}, "signing key is not the issuer's"),
        ({"forge": "wrong_key", "alg": "ES256"}, "signature does not verify"),
    ],
)
async def test_every_bad_token_is_unauthenticated_without_quoting_it(
    verifier, sandbox_idp, claims, reason
):
    token = await id_token(sandbox_idp.url, ADA, **claims)
    with pytest.raises(Unauthenticated, match=reason) as info:
        await verifier.verify(token)
    assert token not in str(info.value) and token.split(".")[1] not in str(info.value)


async def test_a_token_within_the_leeway_still_verifies(verifier, sandbox_idp):
    token = await id_token(sandbox_idp.url, ADA, expires_in=-5)
    assert (await verifier.verify(token)).name == ADA


async def test_rotation_the_new_key_verifies_and_a_dropped_key_does_not(own_idp):
    verifier = OidcVerifier(own_idp.url, "agentrun", refetch_interval=0)
    try:
        old = await id_token(own_idp.url, ADA)
        assert (await verifier.verify(old)).name == ADA  # the JWKS is now cached
        # Rotation with a grace period: both keys are published, both verify.
        await rotate(own_idp.url, grace_seconds=600)
        new = await id_token(own_idp.url, ADA)
        assert (await verifier.verify(new)).name == ADA  # an unknown kid made it refetch
        assert (await verifier.verify(old)).name == ADA
        # Rotating with no grace drops the current key at once; the first is still in its grace.
        dropped = await rotate(own_idp.url, grace_seconds=0)
        newest = await id_token(own_idp.url, ADA)
        assert (await verifier.verify(newest)).name == ADA  # refetched: the dropped key is gone
        assert dropped["retired"][0] not in (await stats(own_idp.url))["published"]
        with pytest.raises(Unauthenticated, match="signing key"):
            await verifier.verify(new)
        assert (await verifier.verify(old)).name == ADA
    finally:
        await verifier.close()


async def test_garbage_kids_do_not_make_it_hammer_the_issuer(own_idp):
    verifier = OidcVerifier(own_idp.url, "agentrun", refetch_interval=60)
    try:
        assert (await verifier.verify(await id_token(own_idp.url, ADA))).name == ADA
        before = await stats(own_idp.url)
        forged = [await id_token(own_idp.url, ADA, forge="unknown_key") for _ in range(5)]
        results = await asyncio.gather(
            *(verifier.verify(t) for t in forged * 20), return_exceptions=True
        )
        assert all(isinstance(r, Unauthenticated) for r in results)
        after = await stats(own_idp.url)
        assert (
            after["jwks"] - before["jwks"] <= 1 and after["discovery"] == before["discovery"] == 1
        )
    finally:
        await verifier.close()


async def test_discovery_is_fetched_once_and_the_jwks_is_cached(own_idp):
    verifier = OidcVerifier(own_idp.url, "agentrun")
    try:
        tokens = [
            await id_token(own_idp.url, f"p{i}@example.com", alg=a)
            for i, a in enumerate(["RS256", "ES256"] * 10)
        ]
        for token in tokens:
            await verifier.verify(token)
        assert {k: v for k, v in (await stats(own_idp.url)).items() if k != "published"} == {
            "discovery": 1,
            "jwks": 1,
            "tokens": 20,
        }
    finally:
        await verifier.close()


async def test_an_unreachable_issuer_is_unauthenticated_not_an_error(unused_tcp_port):
    verifier = OidcVerifier(f"http://127.0.0.1:{unused_tcp_port}", "agentrun", timeout=1)
    try:
        with pytest.raises(Unauthenticated, match="unreachable"):
            await verifier.verify("eyJhbGciOiJSUzI1NiIsImtpZCI6ImsifQ.e30.c2ln")
    finally:
        await verifier.close()


async def test_a_discovery_naming_another_issuer_is_refused(sandbox_idp):
    # The IdP's discovery says its issuer is its URL; a trailing slash is another issuer.
    verifier = OidcVerifier(sandbox_idp.url + "/", "agentrun")
    try:
        with pytest.raises(Unauthenticated, match="another issuer"):
            await verifier.verify(await id_token(sandbox_idp.url, ADA))
    finally:
        await verifier.close()
