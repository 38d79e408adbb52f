"""A faithful OAuth 2.0 authorization server for the sandbox tool providers.

Served by the providers sandbox (`python -m sandbox providers`), one issuer per
provider under ``/oauth/{provider}/``, so the providers check the very tokens it
issued:

* ``GET /oauth/{provider}/authorize`` — the authorization-code flow with PKCE
  (S256 only). There is no consent screen: the sandbox grants at once, for the
  account named by ``login_hint`` (default ``user@{provider}``), the requested
  ``scope``, and redirects to ``redirect_uri`` with ``code`` and ``state``.
* ``POST /oauth/{provider}/token`` — form-encoded (RFC 6749 §4.1.3, §6):
  ``grant_type=authorization_code`` (``code``, ``code_verifier``,
  ``redirect_uri``, ``client_id``, ``client_secret``) or
  ``grant_type=refresh_token`` (``refresh_token``, client credentials).
  Access tokens expire (``access_ttl_seconds``, default 3600). Refresh tokens
  rotate: every refresh answers a new pair and retires the presented refresh
  token. Presenting a retired one is reuse (RFC 9700 §4.14.2): the sandbox
  revokes the whole grant — every access and refresh token of it — and answers
  ``invalid_grant``; ``reuse_revocations`` counts these.
* ``POST /oauth/{provider}/revoke`` — RFC 7009: form-encoded ``token`` (and an
  optional ``token_type_hint``) with the client's credentials (§2.1: a
  confidential client authenticates, else 401 ``invalid_client``). Revoking an
  access or a refresh token revokes its whole grant (§2: the server may, and
  for a refresh token should, revoke the grant's other tokens); an unknown
  token is not an error (200, §2.2). ``revoke_calls`` and ``revocations``
  count them.

Test controls (never logged as provider calls):

* ``GET /_sandbox/oauth/stats`` — ``token_calls`` (every token-endpoint
  request), ``refresh_calls``, ``reuse_revocations``, ``grants``.
* ``POST /_sandbox/oauth/config`` — ``{"access_ttl_seconds": 2}``;
  ``{"reuse_grace_seconds": 30}``: the refresh token retired by a grant's last
  rotation answers that rotation's pair again for this long (a reuse interval,
  as Auth0 and Okta offer) instead of counting as reuse (default 0: strict);
  ``{"fail_revocations": 1}``: the next revocation request answers 503
  (§2.2.1: the server is temporarily unavailable) and revokes nothing;
  ``{"require": {"chat": true}}`` makes a provider refuse calls without a token
  (by default a call without ``Authorization`` is served as before, as the
  shared ``default`` account).
* ``POST /_sandbox/oauth/revoke`` — ``{"provider", "account"}``: the user
  revoked the app.
* ``POST /_sandbox/oauth/scopes`` — ``{"provider", "account", "scopes": [...]}``:
  the grant's scopes change; live access tokens follow the grant.
* ``POST /_sandbox/oauth/expire`` — ``{"provider", "account"}``: its access
  tokens expire now.
* ``POST /_sandbox/oauth/drop_refresh`` — ``{"times": 1}``: the next refresh
  is performed (the pair rotates) but its response is lost.

A provider call is checked by `OAuthServer.check`: a bearer token that is
unknown, expired or revoked answers 401; one whose grant lacks the endpoint's
scope (``{provider}:read`` for GET, ``{provider}:write`` otherwise) answers 403
``insufficient_scope`` (RFC 6750 §3.1). The request log records the token's
account and ``token_id`` (grant and generation, not the token) so tests can see
which token a call carried without the token itself appearing anywhere.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from sandbox.faults import DroppedResponse, FaultSpecError, optional_number, optional_whole
from sandbox.json_http import JSONResponse, read_json

CLIENT_ID = "agentrun"
CLIENT_SECRET = "sandbox-client-secret"  # noqa: S105 - a sandbox's well-known test secret
DEFAULT_ACCESS_TTL = 3600.0
CODE_TTL = 600.0


def required_scope(provider: str, method: str) -> str:
    return f"{provider}:{'read' if method == 'GET' else 'write'}"


def s256(verifier: str) -> str:
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


@dataclass
class Grant:
    grant_id: str
    provider: str
    account: str
    scopes: set[str]
    generation: int = 0
    refresh_token: str = ""
    retired_refresh: set[str] = field(default_factory=set)
    revoked: bool = False
    # The last rotation: the token it retired, when, and its answer (for the grace window).
    previous_refresh: str = ""
    rotated_at: float = 0.0
    last_answer: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AccessToken:
    grant: Grant
    generation: int
    expires_at: float

    @property
    def token_id(self) -> str:
        return f"{self.grant.grant_id}/{self.generation}"


@dataclass(frozen=True)
class PendingCode:
    provider: str
    account: str
    scopes: frozenset[str]
    redirect_uri: str
    challenge: str
    expires_at: float


@dataclass(frozen=True)
class Checked:
    """What a provider call's Authorization header amounted to."""

    refusal: Response | None = None
    account: str = "default"
    token_id: str | None = None


class OAuthError(Exception):
    def __init__(self, error: str, description: str, status: int = 400) -> None:
        super().__init__(description)
        self.error, self.description, self.status = error, description, status


class OAuthServer:
    """Grants, codes and tokens of every sandbox provider, in memory."""

    def __init__(self, providers: list[str]) -> None:
        self.provider_names = set(providers)
        self.access_ttl = DEFAULT_ACCESS_TTL
        # Seconds during which the refresh token retired by the last rotation still answers
        # that rotation's pair (0: strict RFC 9700 rotation, any reuse revokes the grant).
        self.reuse_grace = 0.0
        self.require: set[str] = set()
        self.codes: dict[str, PendingCode] = {}
        self.grants: dict[str, Grant] = {}
        self.access: dict[str, AccessToken] = {}
        self.refresh_index: dict[str, Grant] = {}
        self.drop_refreshes = 0
        self.fail_revocations = 0
        self.stats = {
            "token_calls": 0,
            "refresh_calls": 0,
            "reuse_revocations": 0,
            "revoke_calls": 0,
            "revocations": 0,
        }

    def routes(self) -> list[Route]:
        return [
            Route("/oauth/{provider}/authorize", self.authorize, methods=["GET"]),
            Route("/oauth/{provider}/token", self.token, methods=["POST"]),
            Route("/oauth/{provider}/revoke", self.revoke_endpoint, methods=["POST"]),
            Route("/_sandbox/oauth/stats", self.stats_endpoint, methods=["GET", "DELETE"]),
            Route("/_sandbox/oauth/config", self.config_endpoint, methods=["POST"]),
            Route("/_sandbox/oauth/revoke", self.control(self.revoke_account), methods=["POST"]),
            Route("/_sandbox/oauth/scopes", self.control(self.set_scopes), methods=["POST"]),
            Route("/_sandbox/oauth/expire", self.control(self.expire_account), methods=["POST"]),
            Route("/_sandbox/oauth/drop_refresh", self.drop_endpoint, methods=["POST"]),
            Route("/_sandbox/oauth/tokens", self.tokens_endpoint, methods=["GET"]),
        ]

    # -- the authorization server -------------------------------------------------------

    async def authorize(self, request: Request) -> Response:
        provider = request.path_params["provider"]
        q = request.query_params
        problem = self._authorize_problem(provider, q)
        if problem:
            return JSONResponse({"error": "invalid_request", "error_description": problem}, 400)
        code = secrets.token_urlsafe(24)
        self.codes[code] = PendingCode(
            provider=provider,
            account=q.get("login_hint") or f"user@{provider}",
            scopes=frozenset(q.get("scope", "").split()),
            redirect_uri=q["redirect_uri"],
            challenge=q["code_challenge"],
            expires_at=time.time() + CODE_TTL,
        )
        query = urlencode({"code": code, "state": q.get("state", "")})
        sep = "&" if "?" in q["redirect_uri"] else "?"
        return RedirectResponse(f"{q['redirect_uri']}{sep}{query}", status_code=302)

    def _authorize_problem(self, provider: str, q: Mapping[str, str]) -> str | None:
        if provider not in self.provider_names:
            return f"unknown provider {provider}"
        if q.get("response_type") != "code":
            return "response_type must be code"
        if q.get("client_id") != CLIENT_ID:
            return "unknown client_id"
        if not q.get("redirect_uri"):
            return "missing redirect_uri"
        if q.get("code_challenge_method") != "S256" or not q.get("code_challenge"):
            return "PKCE with code_challenge_method=S256 is required"
        return None

    async def token(self, request: Request) -> Response:
        self.stats["token_calls"] += 1
        form = await _form(request)
        provider = request.path_params["provider"]
        try:
            _check_client(form)
            if form.get("grant_type") == "authorization_code":
                return JSONResponse(self._exchange(provider, form))
            if form.get("grant_type") == "refresh_token":
                return self._refresh_response(provider, form)
            raise OAuthError("unsupported_grant_type", "grant_type is not supported")
        except OAuthError as exc:
            body = {"error": exc.error, "error_description": exc.description}
            return JSONResponse(body, status_code=exc.status)

    def _exchange(self, provider: str, form: Mapping[str, Any]) -> dict[str, Any]:
        pending = self.codes.pop(str(form.get("code", "")), None)
        if pending is None or pending.provider != provider or pending.expires_at < time.time():
            raise OAuthError("invalid_grant", "unknown, used or expired code")
        if form.get("redirect_uri") != pending.redirect_uri:
            raise OAuthError("invalid_grant", "redirect_uri does not match")
        if s256(str(form.get("code_verifier", ""))) != pending.challenge:
            raise OAuthError("invalid_grant", "code_verifier does not match the challenge")
        grant = Grant(secrets.token_hex(6), provider, pending.account, set(pending.scopes))
        self.grants[grant.grant_id] = grant
        return self._issue(grant)

    def _refresh_response(self, provider: str, form: Mapping[str, Any]) -> Response:
        self.stats["refresh_calls"] += 1
        body = self._refresh(provider, str(form.get("refresh_token", "")))
        if self.drop_refreshes > 0:
            self.drop_refreshes -= 1
            return DroppedResponse()  # rotated, but the client never learns the new pair
        return JSONResponse(body)

    def _refresh(self, provider: str, presented: str) -> dict[str, Any]:
        grant = self.refresh_index.get(presented)
        if grant is None or grant.provider != provider:
            raise OAuthError("invalid_grant", "unknown refresh token")
        if grant.revoked:
            raise OAuthError("invalid_grant", "the grant was revoked")
        if presented == grant.previous_refresh and self._in_grace(grant):
            # The answer to that rotation was lost on its way: the same pair again
            # (a provider's reuse interval, as Auth0 and Okta offer; off by default).
            return grant.last_answer
        if presented != grant.refresh_token:
            # RFC 9700 §4.14.2: a retired refresh token came back; the legitimate client
            # and an attacker cannot be told apart, so the whole grant goes.
            self.stats["reuse_revocations"] += 1
            self._revoke(grant)
            raise OAuthError("invalid_grant", "refresh token reuse: the grant is revoked")
        grant.retired_refresh.add(presented)
        grant.previous_refresh, grant.rotated_at = presented, time.time()
        grant.last_answer = self._issue(grant)
        return grant.last_answer

    def _in_grace(self, grant: Grant) -> bool:
        return self.reuse_grace > 0 and time.time() - grant.rotated_at <= self.reuse_grace

    def _issue(self, grant: Grant) -> dict[str, Any]:
        grant.generation += 1
        access, refresh = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        self.access[access] = AccessToken(grant, grant.generation, time.time() + self.access_ttl)
        grant.refresh_token = refresh
        self.refresh_index[refresh] = grant
        return {
            "access_token": access,
            "token_type": "Bearer",
            "expires_in": self.access_ttl,
            "refresh_token": refresh,
            "scope": " ".join(sorted(grant.scopes)),
            "account": grant.account,
        }

    def _revoke(self, grant: Grant) -> None:
        grant.revoked = True

    async def revoke_endpoint(self, request: Request) -> Response:
        self.stats["revoke_calls"] += 1
        form = await _form(request)
        try:
            _check_client(form)
        except OAuthError as exc:
            body = {"error": exc.error, "error_description": exc.description}
            return JSONResponse(body, status_code=exc.status)
        if self.fail_revocations > 0:
            self.fail_revocations -= 1
            return JSONResponse({"error": "temporarily_unavailable"}, status_code=503)
        token = str(form.get("token", ""))
        found = self.access.get(token)
        grant = found.grant if found else self.refresh_index.get(token)
        if grant is not None and grant.provider == request.path_params["provider"]:
            self._revoke(grant)
            self.stats["revocations"] += 1
        return Response(status_code=200)  # RFC 7009 §2.2: unknown tokens are not an error

    # -- what the providers ask ---------------------------------------------------------

    def check(self, provider: str, method: str, headers: Mapping[str, str]) -> Checked:
        """Whether a provider call may proceed, and as which account."""
        header = headers.get("authorization")
        if header is None:
            if provider in self.require:
                return Checked(_bearer_refusal(401, "invalid_request", "a token is required"))
            return Checked()
        scheme, _, token = header.partition(" ")
        found = self.access.get(token.strip()) if scheme.lower() == "bearer" else None
        if found is None or found.grant.provider != provider:
            return Checked(_bearer_refusal(401, "invalid_token", "unknown token"))
        if found.grant.revoked:
            return Checked(_bearer_refusal(401, "invalid_token", "the grant was revoked"))
        if found.expires_at <= time.time():
            return Checked(_bearer_refusal(401, "invalid_token", "the access token expired"))
        scope = required_scope(provider, method)
        if scope not in found.grant.scopes:
            return Checked(_bearer_refusal(403, "insufficient_scope", f"needs {scope}", scope))
        return Checked(None, found.grant.account, found.token_id)

    # -- test controls ------------------------------------------------------------------

    async def stats_endpoint(self, request: Request) -> Response:
        if request.method == "DELETE":
            self.stats = dict.fromkeys(self.stats, 0)
        return JSONResponse({**self.stats, "grants": self._grants_json()})

    def _grants_json(self) -> list[dict[str, Any]]:
        return [
            {
                "grant_id": g.grant_id,
                "provider": g.provider,
                "account": g.account,
                "scopes": sorted(g.scopes),
                "generation": g.generation,
                "revoked": g.revoked,
            }
            for g in self.grants.values()
        ]

    async def config_endpoint(self, request: Request) -> Response:
        body = await _json(request)
        try:  # every setting checked before any is applied
            ttl = optional_number(body, "access_ttl_seconds")
            grace = optional_number(body, "reuse_grace_seconds")
            failures = optional_whole(body, "fail_revocations")
        except FaultSpecError as exc:
            return JSONResponse({"error": str(exc)}, 400)
        require = body.get("require", {})
        if not isinstance(require, dict):
            return JSONResponse({"error": "require must map providers to true or false"}, 400)
        if ttl is not None:
            self.access_ttl = float(ttl)
        if grace is not None:
            self.reuse_grace = float(grace)
        if failures is not None:
            self.fail_revocations = failures
        for provider, required in require.items():
            (self.require.add if required else self.require.discard)(provider)
        return JSONResponse(
            {"access_ttl_seconds": self.access_ttl, "require": sorted(self.require)}
        )

    async def tokens_endpoint(self, request: Request) -> Response:
        """The access tokens issued to `?account=`, so a test can search its outputs for them."""
        account = request.query_params.get("account", "")
        found = [t for t, a in self.access.items() if a.grant.account == account]
        return JSONResponse({"tokens": found})

    async def drop_endpoint(self, request: Request) -> Response:
        try:
            times = optional_whole(await _json(request), "times")
        except FaultSpecError as exc:
            return JSONResponse({"error": str(exc)}, 400)
        self.drop_refreshes = 1 if times is None else times
        return JSONResponse({"drop_refreshes": self.drop_refreshes})

    def control(self, action: Any) -> Any:
        async def endpoint(request: Request) -> Response:
            body = await _json(request)
            grants = [
                g
                for g in self.grants.values()
                if g.provider == body.get("provider") and g.account == body.get("account")
            ]
            if not grants:
                return JSONResponse({"error": "no such grant"}, status_code=404)
            for grant in grants:
                action(grant, body)
            return JSONResponse({"grants": self._grants_json()})

        return endpoint

    def revoke_account(self, grant: Grant, body: Mapping[str, Any]) -> None:
        self._revoke(grant)

    def set_scopes(self, grant: Grant, body: Mapping[str, Any]) -> None:
        grant.scopes = set(body.get("scopes", []))

    def expire_account(self, grant: Grant, body: Mapping[str, Any]) -> None:
        for token, found in list(self.access.items()):
            if found.grant is grant:
                self.access[token] = AccessToken(grant, found.generation, time.time() - 1)


def _check_client(form: Mapping[str, Any]) -> None:
    if form.get("client_id") != CLIENT_ID or form.get("client_secret") != CLIENT_SECRET:
        raise OAuthError("invalid_client", "client authentication failed", status=401)


def _bearer_refusal(status: int, error: str, description: str, scope: str = "") -> Response:
    challenge = f'Bearer error="{error}", error_description="{description}"'
    if scope:
        challenge += f', scope="{scope}"'
    return JSONResponse(
        {"error": error, "error_description": description},
        status_code=status,
        headers={"WWW-Authenticate": challenge},
    )


async def _form(request: Request) -> dict[str, str]:
    """A form-encoded body (RFC 6749 token requests), without python-multipart."""
    return dict(parse_qsl((await request.body()).decode("utf-8", "replace")))


async def _json(request: Request) -> dict[str, Any]:
    body = await read_json(request)
    return body if isinstance(body, dict) else {}
