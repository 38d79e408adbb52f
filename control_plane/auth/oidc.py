"""OpenID Connect sign-in: ID tokens verified against the configured issuer's JWKS.

Interface (the identity interceptor and the HTTP guard call it):

    verifier = OidcVerifier(issuer, audience)
    person = await verifier.verify(id_token)   # VerifiedPerson, or raises Unauthenticated

What is checked: the signature, with a key of the issuer's JWKS named by the
token's `kid`, under RS256 or ES256 only, and the algorithm must match the
key's type (no `none`, no HS*, no RSA key used as an HMAC secret); `iss` equal
to the configured issuer, `aud` containing the audience (and `azp` naming it
when there are several), `exp`, `nbf` and `iat` with a small leeway; an
`email` with `email_verified` true. The person's `name` is that email,
lower-cased.

The discovery document is fetched once; the JWKS is cached for `jwks_ttl`
seconds. A token naming an unknown `kid` (the issuer rotated its keys) makes
at most one refetch per `refetch_interval`, so garbage tokens cannot make us
hammer the issuer. Every failure is `Unauthenticated` with a reason that
never contains the token.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import jwt
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from control_plane.ground.errors import Unauthenticated

log = logging.getLogger(__name__)

ALGORITHMS = ("RS256", "ES256")
# The JWK key type (and curve) each accepted algorithm needs: the alg-confusion guard.
KEY_TYPES = {"RS256": ("RSA", None), "ES256": ("EC", "P-256")}
MAX_TOKEN_BYTES = 16 * 1024
MAX_DOCUMENT_BYTES = 256 * 1024
MAX_KEYS = 32
REQUIRED_CLAIMS = ["iss", "sub", "aud", "exp", "iat"]

_REASONS: tuple[tuple[type[Exception], str], ...] = (
    (jwt.ExpiredSignatureError, "the ID token has expired"),
    (jwt.ImmatureSignatureError, "the ID token is not valid yet"),
    (jwt.InvalidAudienceError, "the ID token is for another audience"),
    (jwt.InvalidIssuerError, "the ID token is from another issuer"),
    (jwt.InvalidSignatureError, "the ID token's signature does not verify"),
    (jwt.InvalidIssuedAtError, "the ID token's iat is not a time"),
)


@dataclass(frozen=True)
class VerifiedPerson:
    """A person whose ID token verified: `name` (the verified email) is the principal name."""

    issuer: str
    subject: str
    name: str


def looks_like_jwt(token: str) -> bool:
    """Three base64url parts: an ID token rather than one of our API keys."""
    return token.count(".") == 2 and not token.startswith("agr_")


@dataclass(frozen=True)
class _Key:
    alg: str
    key: Any  # a cryptography public key


def parse_jwks(document: Any, limit: int = MAX_KEYS) -> dict[str, _Key]:
    """The usable signing keys of a JWKS by kid (others skipped; at most `limit`)."""
    keys: dict[str, _Key] = {}
    entries = document.get("keys") if isinstance(document, dict) else None
    for jwk in entries if isinstance(entries, list) else []:
        parsed = _parse_jwk(jwk)
        if parsed is not None and len(keys) < limit:
            keys[jwk["kid"]] = parsed
    return keys


def _parse_jwk(jwk: Any) -> _Key | None:
    if not isinstance(jwk, dict) or not isinstance(jwk.get("kid"), str):
        return None
    if jwk.get("use", "sig") != "sig":
        return None
    kty, crv = jwk.get("kty"), jwk.get("crv")
    algs = [a for a, (t, c) in KEY_TYPES.items() if t == kty and (c is None or c == crv)]
    alg = jwk.get("alg") or (algs[0] if algs else None)
    if alg not in algs:  # an HS*/unknown alg, or an alg that does not fit the key type
        return None
    try:
        key = RSAAlgorithm.from_jwk(jwk) if kty == "RSA" else ECAlgorithm.from_jwk(jwk)
    except (jwt.InvalidKeyError, ValueError, TypeError, KeyError):
        return None
    return _Key(alg, key)


def check_header(header: Any) -> tuple[str, str]:
    """The (alg, kid) of an unverified header, refusing any algorithm but RS256/ES256."""
    if not isinstance(header, dict):
        raise Unauthenticated("malformed ID token")
    alg, kid = header.get("alg"), header.get("kid")
    if alg not in ALGORITHMS:
        raise Unauthenticated("the ID token's algorithm is not accepted (RS256 or ES256 only)")
    if not isinstance(kid, str) or not kid or len(kid) > 256:
        raise Unauthenticated("the ID token names no signing key (kid)")
    return alg, kid


def person_of(claims: dict[str, Any], audience: str) -> VerifiedPerson:
    """The verified person the (already signature- and time-checked) claims describe."""
    aud = claims.get("aud")
    if isinstance(aud, list) and len(aud) > 1 and claims.get("azp") != audience:
        raise Unauthenticated("the ID token has several audiences and azp is not ours")
    email = claims.get("email")
    if not isinstance(email, str) or "@" not in email or len(email) > 320:
        raise Unauthenticated("the ID token has no email")
    if claims.get("email_verified") is not True:
        raise Unauthenticated("the ID token's email is not verified")
    sub = claims.get("sub")
    if not isinstance(sub, str) or not sub:
        raise Unauthenticated("the ID token has no subject")
    return VerifiedPerson(issuer=str(claims["iss"]), subject=sub, name=email.strip().lower())


def reason_for(exc: jwt.PyJWTError) -> str:
    """A fixed reason for a pyjwt failure (never its message: that may quote the input)."""
    if isinstance(exc, jwt.MissingRequiredClaimError):
        return f"the ID token lacks the {exc.claim} claim"
    for kind, reason in _REASONS:
        if isinstance(exc, kind):
            return reason
    return "malformed ID token"


class OidcVerifier:
    """Verifies ID tokens (RS256/ES256) of one issuer for one audience."""

    def __init__(
        self,
        issuer: str,
        audience: str,
        *,
        client: httpx.AsyncClient | None = None,
        jwks_ttl: float = 300.0,
        refetch_interval: float = 10.0,
        leeway: float = 30.0,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.issuer = issuer
        self.audience = audience
        self.jwks_ttl, self.refetch_interval, self.leeway = jwks_ttl, refetch_interval, leeway
        self._client, self._owns_client, self._timeout = client, client is None, timeout
        self._clock = clock
        self._jwks_uri: str | None = None
        self._keys: dict[str, _Key] = {}
        self._fetched_at: float | None = None  # last successful JWKS fetch
        self._tried_at: float | None = None  # last attempt, successful or not
        self._lock = asyncio.Lock()

    async def verify(self, id_token: str) -> VerifiedPerson:
        if len(id_token) > MAX_TOKEN_BYTES or not looks_like_jwt(id_token):
            raise Unauthenticated("malformed ID token")
        try:
            alg, kid = check_header(jwt.get_unverified_header(id_token))
        except jwt.PyJWTError:
            raise Unauthenticated("malformed ID token") from None
        key = await self._key(kid)
        if key.alg != alg:
            raise Unauthenticated("the ID token's algorithm does not match its signing key")
        try:
            claims = jwt.decode(
                id_token,
                key.key,
                algorithms=[key.alg],
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway,
                options={"require": REQUIRED_CLAIMS},
            )
        except jwt.PyJWTError as exc:
            raise Unauthenticated(reason_for(exc)) from None
        return person_of(claims, self.audience)

    async def close(self) -> None:
        if self._client is not None and self._owns_client:
            await self._client.aclose()
        self._client = None

    async def _key(self, kid: str) -> _Key:
        """The issuer's key `kid`: cached, refetched when stale or (rate-limited) unknown."""
        now = self._clock()
        stale = self._fetched_at is None or now - self._fetched_at >= self.jwks_ttl
        if stale or kid not in self._keys:
            async with self._lock:  # one fetch at a time; waiters reuse its result
                await self._refresh(kid)
        key = self._keys.get(kid)
        if key is None:
            raise Unauthenticated("the ID token's signing key is not the issuer's")
        return key

    async def _refresh(self, kid: str) -> None:
        now = self._clock()
        fresh = self._fetched_at is not None and now - self._fetched_at < self.jwks_ttl
        if fresh and kid in self._keys:
            return  # another caller refreshed while we waited
        if self._tried_at is not None and now - self._tried_at < self.refetch_interval:
            if self._fetched_at is None:
                raise Unauthenticated("the identity provider is unreachable")
            return  # fetched a moment ago: an unknown kid stays unknown for now
        self._tried_at = now
        try:
            keys = parse_jwks(await self._get_json(await self._jwks_url()))
        except Unauthenticated:
            if self._fetched_at is None:
                raise
            log.warning("the identity provider's JWKS could not be fetched; using the cache")
            return
        self._keys, self._fetched_at = keys, now

    async def _jwks_url(self) -> str:
        """The JWKS address from the issuer's discovery document (fetched once)."""
        if self._jwks_uri is None:
            doc = await self._get_json(
                f"{self.issuer.rstrip('/')}/.well-known/openid-configuration"
            )
            if not isinstance(doc, dict) or doc.get("issuer") != self.issuer:
                raise Unauthenticated("the identity provider's discovery names another issuer")
            uri = doc.get("jwks_uri")
            if not isinstance(uri, str) or not uri.startswith(("https://", "http://")):
                raise Unauthenticated("the identity provider's discovery has no jwks_uri")
            self._jwks_uri = uri
        return self._jwks_uri

    async def _get_json(self, url: str) -> Any:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self._timeout, follow_redirects=False)
        try:
            async with self._client.stream("GET", url) as resp:
                resp.raise_for_status()
                body = b""
                async for chunk in resp.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_DOCUMENT_BYTES:
                        raise ValueError("document too large")
            return json.loads(body)
        except (httpx.HTTPError, ValueError, RecursionError) as exc:
            log.warning("identity provider request %s failed: %s", url, type(exc).__name__)
            raise Unauthenticated("the identity provider is unreachable") from None


def from_settings(issuer: str | None, audience: str) -> OidcVerifier | None:
    """The configured verifier (`AGENTRUN_OIDC_ISSUER`), or None when sign-in is off."""
    return OidcVerifier(issuer, audience) if issuer else None
