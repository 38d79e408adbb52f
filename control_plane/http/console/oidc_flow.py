"""OpenID Connect sign-in for people: the authorization-code flow with PKCE.

1. `begin`: a random state, nonce and PKCE verifier go into a short-lived
   HttpOnly cookie (SameSite=Lax: the IdP's redirect back is a cross-site
   navigation); the browser is sent to the issuer's `authorization_endpoint`
   (from its discovery document) with the state, the nonce and the verifier's
   S256 challenge.
2. `finish`: the callback's state must equal the cookie's (constant time); the
   code is exchanged at the `token_endpoint` with the verifier; the ID token is
   resolved by the replica's Resolver exactly as a gRPC bearer token is (its
   OidcVerifier checks signature, issuer, audience, times and the verified
   email; then the membership gives the role), and its nonce must be ours.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx
import jwt

from control_plane.auth.oidc import OidcVerifier
from control_plane.auth.principal import Principal
from control_plane.auth.resolver import Resolver
from control_plane.ground.errors import Unauthenticated
from control_plane.http.console import security

FLOW_SECONDS = 600


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass(frozen=True)
class Flow:
    """What the browser carries between the redirect to the IdP and the callback."""

    state: str
    nonce: str
    verifier: str
    workspace_id: str

    def cookie(self) -> str:
        return _b64(json.dumps(self.__dict__).encode())

    @classmethod
    def of_cookie(cls, value: str | None) -> Flow:
        try:
            raw = base64.urlsafe_b64decode((value or "") + "=" * (-len(value or "") % 4))
            return cls(**{k: str(v) for k, v in json.loads(raw).items()})
        except (ValueError, TypeError):
            raise Unauthenticated(
                "the sign-in expired or was started elsewhere; start again"
            ) from None


class CodeFlow:
    def __init__(self, verifier: OidcVerifier, resolver: Resolver, timeout: float = 5.0) -> None:
        self.verifier = verifier
        self.resolver = resolver
        self.client_id = verifier.audience
        self._timeout = timeout
        self._endpoints: tuple[str, str] | None = None

    async def _discover(self) -> tuple[str, str]:
        """(authorization_endpoint, token_endpoint) of the issuer (fetched once)."""
        if self._endpoints is None:
            url = f"{self.verifier.issuer.rstrip('/')}/.well-known/openid-configuration"
            doc = await self._call("GET", url)
            auth, token = doc.get("authorization_endpoint"), doc.get("token_endpoint")
            if doc.get("issuer") != self.verifier.issuer or not (
                isinstance(auth, str) and isinstance(token, str)
            ):
                raise Unauthenticated("the identity provider's discovery has no code flow")
            self._endpoints = (auth, token)
        return self._endpoints

    async def _call(self, method: str, url: str, form: dict[str, str] | None = None) -> Any:
        try:
            async with httpx.AsyncClient(timeout=self._timeout) as client:
                resp = await client.request(method, url, data=form)
            resp.raise_for_status()
            body = resp.json()
        except (httpx.HTTPError, ValueError, RecursionError):
            raise Unauthenticated("the identity provider refused or could not be reached") from None
        if not isinstance(body, dict):
            raise Unauthenticated("the identity provider answered something unexpected")
        return body

    async def begin(self, workspace_id: str, redirect_uri: str) -> tuple[str, Flow]:
        """The IdP address to send the browser to, and the flow to keep in its cookie."""
        authorize, _ = await self._discover()
        flow = Flow(security.new_token(), security.new_token(), security.new_token(), workspace_id)
        challenge = _b64(hashlib.sha256(flow.verifier.encode()).digest())
        query = urlencode(
            {
                "response_type": "code",
                "client_id": self.client_id,
                "redirect_uri": redirect_uri,
                "scope": "openid email",
                "state": flow.state,
                "nonce": flow.nonce,
                "code_challenge": challenge,
                "code_challenge_method": "S256",
            }
        )
        return f"{authorize}?{query}", flow

    async def finish(self, flow: Flow, state: str, code: str, redirect_uri: str) -> Principal:
        """The signed-in person the callback's code stands for (raises Unauthenticated,
        or PermissionDenied for a person who is not a member of the workspace)."""
        if not state or not security.same_text(state, flow.state):
            raise Unauthenticated("the sign-in's state does not match; start again")
        _, token_url = await self._discover()
        answer = await self._call(
            "POST",
            token_url,
            {
                "grant_type": "authorization_code",
                "code": code,
                "redirect_uri": redirect_uri,
                "client_id": self.client_id,
                "code_verifier": flow.verifier,
            },
        )
        id_token = answer.get("id_token")
        if not isinstance(id_token, str):
            raise Unauthenticated("the identity provider sent no ID token")
        who = await self.resolver.resolve(f"Bearer {id_token}", flow.workspace_id)
        # Verified above; read once more for the nonce the verifier does not know about.
        claims = jwt.decode(id_token, options={"verify_signature": False})
        if not security.same_text(str(claims.get("nonce", "")), flow.nonce):
            raise Unauthenticated("the ID token's nonce is not this sign-in's")
        return who
