"""The OAuth 2.0 client of the control plane: one authorization server per provider.

The sandbox serves `{base}/oauth/{provider}/authorize|token|revoke` (sandbox/oauth.py); a real
deployment names each provider's endpoints the same way behind `AGENTRUN_OAUTH_URL`.
Token values appear only inside `TokenAnswer` fields that are left out of its repr; errors
carry the provider's error code, never the request or response body.
"""

from __future__ import annotations

import base64
import hashlib
import math
import secrets
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import httpx

from control_plane.ground import validate

TIMEOUT_SECONDS = 10.0
# A token's lifetime when the answer gives none that is a number of seconds, and the most
# one is believed (a year: no refresh is put off further on a provider's word).
DEFAULT_LIFETIME_SECONDS = 3600.0
MAX_LIFETIME_SECONDS = 365 * 86400.0


class GrantRefused(Exception):
    """The provider refused the grant (invalid_grant, invalid_client...): reconnect needed."""

    def __init__(self, error: str) -> None:
        super().__init__(f"the provider refused the grant: {error}")
        self.error = error


class ProviderUnreachable(Exception):
    """No answer (network, a dropped response, a 5xx): the outcome is unknown."""


@dataclass(frozen=True)
class TokenAnswer:
    access_token: str = field(repr=False)
    refresh_token: str | None = field(repr=False)
    expires_in: float
    scopes: list[str] | None
    account: str


@dataclass(frozen=True)
class OAuthSettings:
    base_url: str
    client_id: str
    client_secret: str = field(repr=False)


def new_verifier() -> str:
    """A PKCE code verifier (RFC 7636 §4.1: 43-128 unreserved characters)."""
    return secrets.token_urlsafe(48)


def challenge(verifier: str) -> str:
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


class OAuthClient:
    def __init__(self, settings: OAuthSettings) -> None:
        self.settings = settings
        self._http = httpx.AsyncClient(timeout=TIMEOUT_SECONDS)

    async def close(self) -> None:
        await self._http.aclose()

    def authorize_url(
        self,
        provider: str,
        *,
        state: str,
        verifier: str,
        scopes: list[str],
        redirect_uri: str,
        login_hint: str = "",
    ) -> str:
        query = {
            "response_type": "code",
            "client_id": self.settings.client_id,
            "redirect_uri": redirect_uri,
            "scope": " ".join(scopes),
            "state": state,
            "code_challenge": challenge(verifier),
            "code_challenge_method": "S256",
        }
        if login_hint:
            query["login_hint"] = login_hint
        return f"{self.settings.base_url}/oauth/{provider}/authorize?{urlencode(query)}"

    async def exchange(
        self, provider: str, code: str, verifier: str, redirect_uri: str
    ) -> TokenAnswer:
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "code_verifier": verifier,
            "redirect_uri": redirect_uri,
        }
        return await self._token(provider, form)

    async def refresh(self, provider: str, refresh_token: str) -> TokenAnswer:
        form = {"grant_type": "refresh_token", "refresh_token": refresh_token}
        return await self._token(provider, form)

    async def revoke(self, provider: str, token: str, hint: str) -> None:
        """RFC 7009: ask the provider to revoke `token` (and so its grant). Raises
        ProviderUnreachable (no answer, 5xx) or GrantRefused (4xx: the request was refused)."""
        form = {
            "token": token,
            "token_type_hint": hint,
            "client_id": self.settings.client_id,
            "client_secret": self.settings.client_secret,
        }
        url = f"{self.settings.base_url}/oauth/{provider}/revoke"
        try:
            answer = await self._http.post(url, data=form)
        except httpx.HTTPError as exc:
            raise ProviderUnreachable(
                f"revocation endpoint of {provider}: {type(exc).__name__}"
            ) from None
        if answer.status_code >= 500:
            raise ProviderUnreachable(
                f"revocation endpoint of {provider}: HTTP {answer.status_code}"
            )
        if answer.status_code != 200:
            try:
                body = answer.json()
            except (ValueError, RecursionError):
                body = None
            raise GrantRefused(_error_code(body))

    async def _token(self, provider: str, form: dict[str, str]) -> TokenAnswer:
        form = {
            **form,
            "client_id": self.settings.client_id,
            "client_secret": self.settings.client_secret,
        }
        url = f"{self.settings.base_url}/oauth/{provider}/token"
        try:
            answer = await self._http.post(url, data=form)
            body = answer.json()
        except (httpx.HTTPError, ValueError, RecursionError) as exc:
            # No token in the message: only the kind of failure.
            raise ProviderUnreachable(
                f"token endpoint of {provider}: {type(exc).__name__}"
            ) from None
        if answer.status_code >= 500:
            raise ProviderUnreachable(f"token endpoint of {provider}: HTTP {answer.status_code}")
        if answer.status_code != 200:
            raise GrantRefused(_error_code(body))
        return _answer(body)


def _error_code(body: Any) -> str:
    code = body.get("error") if isinstance(body, dict) else None
    return code if isinstance(code, str) and code.isidentifier() else "refused"


def _answer(body: Any) -> TokenAnswer:
    """A token answer, read as RFC 6749 §5.1 has it; a field of another type is absent (a
    token that is not text that can be stored: no token at all)."""
    if not isinstance(body, dict) or not (access := _text(body.get("access_token"))):
        raise ProviderUnreachable("token endpoint answered without an access token")
    scope = _text(body.get("scope"))
    return TokenAnswer(
        access_token=access,
        refresh_token=_text(body.get("refresh_token")) or None,
        expires_in=_lifetime(body.get("expires_in")),
        scopes=scope.split() if scope is not None else None,
        account=_text(body.get("account")) or "",
    )


def _text(value: Any) -> str | None:
    """`value` if it is text Postgres and the sealing can take (validate.unstorable), else
    None."""
    return value if isinstance(value, str) and validate.unstorable(value) is None else None


def _lifetime(value: Any) -> float:
    """`expires_in` in seconds: a positive number (or its digits), at most a year; else
    the default, as when it is left out."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return DEFAULT_LIFETIME_SECONDS
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return DEFAULT_LIFETIME_SECONDS
    seconds = float(value)
    if not math.isfinite(seconds) or seconds <= 0:
        return DEFAULT_LIFETIME_SECONDS
    return min(seconds, MAX_LIFETIME_SECONDS)
