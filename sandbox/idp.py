"""A local OpenID Connect provider: discovery, a JWKS (RS256 and ES256 keys) and ID tokens.

Endpoints:

* ``GET /.well-known/openid-configuration`` — the discovery document; ``issuer``
  is ``--issuer`` or, by default, the URL the client used (``http://host:port``).
* ``GET /jwks.json`` — the published public keys (one RS256 and one ES256 at
  start, plus any retired key still inside its grace period).
* ``POST /token`` — an ID token for the demo and the tests, from a JSON body:
  ``email`` (required), ``audience`` (default ``agentrun``), ``expires_in``
  (seconds, default 3600; negative gives an expired token), ``alg`` (``RS256``
  or ``ES256``), ``email_verified`` (default true), ``issuer`` (override the
  ``iss`` claim), ``not_before`` (seconds from now), ``subject``, ``name`` and
  ``forge``, one of: ``unknown_key`` (signed with a key that is not in the
  JWKS, under a kid nobody published), ``wrong_key`` (a key that is not in the
  JWKS, under the published kid), ``none`` (``alg: none``, no signature) or
  ``hs256`` (HS256 with the published public key's PEM as the secret: the
  algorithm-confusion attack). Answers ``{"id_token": ..., "kid": ...}``.
* ``GET /authorize`` — the authorization-code flow's sign-in page: a test-user form
  (an email) for ``response_type=code`` with ``client_id``, ``redirect_uri``, ``state``,
  ``nonce`` and a PKCE ``code_challenge`` (S256). Its POST redirects to ``redirect_uri``
  with a single-use ``code`` (valid 60 s) and the ``state``.
* ``POST /token`` as a form (``grant_type=authorization_code``, ``code``,
  ``redirect_uri``, ``client_id``, ``code_verifier``) — the code's ID token (audience the
  client id, with the nonce), once; a reused, expired or mismatched code is ``invalid_grant``.
* ``POST /_sandbox/rotate`` — ``{"alg": "RS256", "grace_seconds": 60}``: a new
  signing key for ``alg``; the previous ones stay published for the grace
  period (0 drops them at once), then disappear from the JWKS.
* ``GET /_sandbox/stats`` — how often discovery and the JWKS were fetched
  (tests use it to show the verifier does not refetch on every bad token);
  ``DELETE /_sandbox/requests`` resets the counts.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import html
import json
import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlencode

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from sandbox.faults import FaultSpecError, optional_number
from sandbox.json_http import JSONResponse

ALGORITHMS = ("RS256", "ES256")
DEFAULT_AUDIENCE = "agentrun"
DEFAULT_GRACE_SECONDS = 60.0
CODE_SECONDS = 60.0
AUTHORIZE_FIELDS = ("client_id", "redirect_uri", "state", "nonce", "code_challenge")
FORGERIES = ("unknown_key", "wrong_key", "none", "hs256")

PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey


def new_private_key(alg: str) -> PrivateKey:
    if alg == "RS256":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return ec.generate_private_key(ec.SECP256R1())


@dataclass
class SigningKey:
    alg: str
    kid: str
    private: PrivateKey
    retire_at: float | None = None  # published until then; None while it is current

    @classmethod
    def new(cls, alg: str) -> SigningKey:
        return cls(alg, f"{alg.lower()}-{secrets.token_hex(6)}", new_private_key(alg))

    def public_jwk(self) -> dict[str, Any]:
        public = self.private.public_key()
        if isinstance(public, rsa.RSAPublicKey):
            text = jwt.algorithms.RSAAlgorithm.to_jwk(public)
        else:
            text = jwt.algorithms.ECAlgorithm.to_jwk(public)
        jwk = {k: v for k, v in json.loads(text).items() if k != "key_ops"}
        return {**jwk, "kid": self.kid, "alg": self.alg, "use": "sig"}

    def public_pem(self) -> bytes:
        return self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )


@dataclass(frozen=True)
class Grant:
    """An authorization code's promise: who signed in, for which client, redirect and PKCE."""

    email: str
    client_id: str
    redirect_uri: str
    nonce: str
    code_challenge: str
    expires_at: float


@dataclass
class IdentityProvider:
    """Keys, outstanding authorization codes and counters of one sandbox IdP."""

    issuer: str | None = None
    keys: list[SigningKey] = field(default_factory=lambda: [SigningKey.new(a) for a in ALGORITHMS])
    stats: dict[str, int] = field(default_factory=lambda: {"discovery": 0, "jwks": 0, "tokens": 0})
    codes: dict[str, Grant] = field(default_factory=dict)

    def published(self, now: float | None = None) -> list[SigningKey]:
        """Current keys and retired ones still in their grace period (expired ones dropped)."""
        now = time.time() if now is None else now
        self.keys = [k for k in self.keys if k.retire_at is None or k.retire_at > now]
        return list(self.keys)

    def current(self, alg: str) -> SigningKey:
        return next(k for k in self.published() if k.alg == alg and k.retire_at is None)

    def rotate(self, alg: str, grace_seconds: float) -> tuple[SigningKey, list[str]]:
        retire_at = time.time() + max(grace_seconds, 0.0)
        retired = []
        for key in self.published():
            if key.alg == alg and key.retire_at is None:
                key.retire_at = retire_at
                retired.append(key.kid)
        new = SigningKey.new(alg)
        self.keys.append(new)
        self.published()  # a zero grace drops the old keys now
        return new, retired


class BadTokenRequest(ValueError):
    """The /token body asks for something this IdP does not issue."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _hs256_with_public_key(claims: dict[str, Any], key: SigningKey) -> str:
    """HS256 keyed with the public PEM (pyjwt refuses to build this, as it should)."""
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": key.kid}).encode())
    body = _b64(json.dumps(claims).encode())
    sig = hmac.new(key.public_pem(), f"{header}.{body}".encode(), hashlib.sha256).digest()
    return f"{header}.{body}.{_b64(sig)}"


def _unsigned(claims: dict[str, Any], key: SigningKey) -> str:
    header = _b64(json.dumps({"alg": "none", "typ": "JWT", "kid": key.kid}).encode())
    return f"{header}.{_b64(json.dumps(claims).encode())}."


def claims_for(body: dict[str, Any], issuer: str, now: float) -> dict[str, Any]:
    email = body.get("email")
    if not isinstance(email, str) or "@" not in email:
        raise BadTokenRequest("email is required (an address)")
    expires_in = int(body.get("expires_in", 3600))
    claims = {
        "iss": str(body.get("issuer") or issuer),
        "sub": str(body.get("subject") or uuid.uuid5(uuid.NAMESPACE_URL, email.lower())),
        "aud": body.get("audience", DEFAULT_AUDIENCE),
        "iat": int(now),
        "exp": int(now) + expires_in,
        "email": email,
        "email_verified": body.get("email_verified", True),
    }
    if "not_before" in body:
        claims["nbf"] = int(now) + int(body["not_before"])
    if body.get("name"):
        claims["name"] = str(body["name"])
    if body.get("nonce"):
        claims["nonce"] = str(body["nonce"])
    return claims


def issue(idp: IdentityProvider, body: dict[str, Any], issuer: str) -> tuple[str, str]:
    """An ID token as `body` asks (see the module docstring) and the kid it names."""
    alg = body.get("alg", "RS256")
    forge = body.get("forge")
    if alg not in ALGORITHMS:
        raise BadTokenRequest(f"alg must be one of {', '.join(ALGORITHMS)}")
    if forge is not None and forge not in FORGERIES:
        raise BadTokenRequest(f"forge must be one of {', '.join(FORGERIES)}")
    claims = claims_for(body, issuer, time.time())
    key = idp.current(alg)
    if forge == "none":
        return _unsigned(claims, key), key.kid
    if forge == "hs256":
        return _hs256_with_public_key(claims, key), key.kid
    signer, kid = key.private, key.kid
    if forge == "unknown_key":
        rogue = SigningKey.new(alg)
        signer, kid = rogue.private, rogue.kid
    elif forge == "wrong_key":
        signer = new_private_key(alg)
    return jwt.encode(claims, signer, algorithm=alg, headers={"kid": kid}), kid


def pkce_challenge(verifier: str) -> str:
    """The S256 code challenge of a PKCE code verifier (RFC 7636)."""
    return _b64(hashlib.sha256(verifier.encode()).digest())


def _form(raw: bytes) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(raw.decode(errors="replace")).items()}


def authorize_page(params: dict[str, str]) -> HTMLResponse:
    """The test-user sign-in form; the flow's parameters ride along as hidden fields."""
    hidden = "".join(
        f"<input type='hidden' name='{k}' value='{html.escape(params.get(k, ''))}'>"
        for k in AUTHORIZE_FIELDS
    )
    doc = (
        "<!doctype html><html><head><meta charset='utf-8'><title>Sandbox IdP sign-in</title>"
        "</head><body><h1>Sandbox identity provider</h1><p>Sign in as a test user.</p>"
        f"<form method='post' action='/authorize'>{hidden}<label>Email "
        "<input name='email' type='email' required autofocus></label>"
        "<button type='submit'>Sign in</button></form></body></html>"
    )
    return HTMLResponse(doc, headers={"Content-Security-Policy": "default-src 'none'"})


def grant_code(idp: IdentityProvider, form: dict[str, str]) -> str:
    """A single-use code for the signed-in test user (raises BadTokenRequest)."""
    if "@" not in form.get("email", ""):
        raise BadTokenRequest("email is required (an address)")
    if not form.get("client_id") or not form.get("redirect_uri", "").startswith("http"):
        raise BadTokenRequest("client_id and an http(s) redirect_uri are required")
    if not form.get("code_challenge"):
        raise BadTokenRequest("a PKCE code_challenge (S256) is required")
    code = secrets.token_urlsafe(32)
    idp.codes[code] = Grant(
        form["email"],
        form["client_id"],
        form["redirect_uri"],
        form.get("nonce", ""),
        form["code_challenge"],
        time.time() + CODE_SECONDS,
    )
    return code


def redeem_code(idp: IdentityProvider, form: dict[str, str], issuer: str) -> str:
    """The ID token a code stands for, once (raises BadTokenRequest: invalid_grant)."""
    grant = idp.codes.pop(form.get("code", ""), None)
    if grant is None or grant.expires_at < time.time():
        raise BadTokenRequest("the code is unknown, used or expired")
    if (form.get("redirect_uri"), form.get("client_id")) != (grant.redirect_uri, grant.client_id):
        raise BadTokenRequest("redirect_uri or client_id differ from the authorization request")
    # As bytes: compare_digest refuses str with non-ASCII characters (a 500, not a 400).
    challenge = pkce_challenge(form.get("code_verifier", "")).encode()
    if not hmac.compare_digest(challenge, grant.code_challenge.encode("utf-8", "surrogatepass")):
        raise BadTokenRequest("the code_verifier does not match the code_challenge")
    body = {"email": grant.email, "audience": grant.client_id, "nonce": grant.nonce}
    return issue(idp, body, issuer)[0]


class _Routes:
    """The HTTP face of one IdentityProvider."""

    def __init__(self, state: IdentityProvider) -> None:
        self.state = state

    def issuer_of(self, request: Request) -> str:
        return self.state.issuer or str(request.base_url).rstrip("/")

    async def discovery(self, request: Request) -> Response:
        self.state.stats["discovery"] += 1
        iss = self.issuer_of(request)
        return JSONResponse(
            {
                "issuer": iss,
                "jwks_uri": f"{iss}/jwks.json",
                "token_endpoint": f"{iss}/token",
                "authorization_endpoint": f"{iss}/authorize",
                "response_types_supported": ["code", "id_token"],
                "grant_types_supported": ["authorization_code"],
                "code_challenge_methods_supported": ["S256"],
                "token_endpoint_auth_methods_supported": ["none"],
                "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": list(ALGORITHMS),
                "claims_supported": ["iss", "sub", "aud", "exp", "iat", "email", "email_verified"],
            }
        )

    async def jwks(self, request: Request) -> Response:
        self.state.stats["jwks"] += 1
        keys = [k.public_jwk() for k in self.state.published()]
        return JSONResponse({"keys": keys}, headers={"Cache-Control": "max-age=300"})

    async def authorize(self, request: Request) -> Response:
        params = dict(request.query_params)
        if params.get("response_type") != "code":
            return JSONResponse({"error": "unsupported_response_type"}, 400)
        return authorize_page(params)

    async def sign_in(self, request: Request) -> Response:
        form = _form(await request.body())
        try:
            code = grant_code(self.state, form)
        except BadTokenRequest as exc:
            return JSONResponse({"error": "invalid_request", "detail": str(exc)}, 400)
        query = urlencode({"code": code, "state": form.get("state", "")})
        return RedirectResponse(f"{form['redirect_uri']}?{query}", status_code=303)

    async def code_token(self, request: Request) -> Response:
        form = _form(await request.body())
        if form.get("grant_type") != "authorization_code":
            return JSONResponse({"error": "unsupported_grant_type"}, 400)
        try:
            id_token = redeem_code(self.state, form, self.issuer_of(request))
        except BadTokenRequest as exc:
            return JSONResponse({"error": "invalid_grant", "detail": str(exc)}, 400)
        self.state.stats["tokens"] += 1
        return JSONResponse({"id_token": id_token, "token_type": "Bearer", "expires_in": 3600})

    async def token(self, request: Request) -> Response:
        if request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
            return await self.code_token(request)
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise BadTokenRequest("the body must be a JSON object")
            id_token, kid = issue(self.state, body, self.issuer_of(request))
        except (BadTokenRequest, ValueError, TypeError, RecursionError) as exc:
            return JSONResponse({"error": "invalid_request", "detail": str(exc)}, 400)
        self.state.stats["tokens"] += 1
        return JSONResponse({"id_token": id_token, "token_type": "Bearer", "kid": kid})

    async def rotate(self, request: Request) -> Response:
        try:
            body = json.loads(raw) if (raw := await request.body()) else {}
        except (ValueError, RecursionError):  # not UTF-8, not JSON, or nested past the reader
            return JSONResponse({"error": "the body must be a JSON object"}, 400)
        if not isinstance(body, dict):
            return JSONResponse({"error": "the body must be a JSON object"}, 400)
        alg = body.get("alg", "RS256")
        if not isinstance(alg, str) or alg not in ALGORITHMS:
            return JSONResponse({"error": f"alg must be one of {', '.join(ALGORITHMS)}"}, 400)
        try:
            grace = optional_number(body, "grace_seconds")
        except FaultSpecError as exc:
            return JSONResponse({"error": str(exc)}, 400)
        new, retired = self.state.rotate(alg, DEFAULT_GRACE_SECONDS if grace is None else grace)
        return JSONResponse({"kid": new.kid, "retired": retired})

    async def stats(self, request: Request) -> Response:
        published = [k.kid for k in self.state.published()]
        return JSONResponse({**self.state.stats, "published": published})

    async def reset(self, request: Request) -> Response:
        self.state.stats.update(discovery=0, jwks=0, tokens=0)
        return Response(status_code=204)


def create_app(issuer: str | None = None, idp: IdentityProvider | None = None) -> Starlette:
    r = _Routes(idp or IdentityProvider(issuer))
    return Starlette(
        routes=[
            Route("/.well-known/openid-configuration", r.discovery, methods=["GET"]),
            Route("/jwks.json", r.jwks, methods=["GET"]),
            Route("/token", r.token, methods=["POST"]),
            Route("/authorize", r.authorize, methods=["GET"]),
            Route("/authorize", r.sign_in, methods=["POST"]),
            Route("/_sandbox/rotate", r.rotate, methods=["POST"]),
            Route("/_sandbox/stats", r.stats, methods=["GET"]),
            Route("/_sandbox/requests", r.reset, methods=["DELETE"]),
            Route("/_sandbox/faults", r.reset, methods=["DELETE"]),
        ]
    )
