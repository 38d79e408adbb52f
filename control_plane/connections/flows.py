"""The authorization-code flow with PKCE, from the start link to the callback.

`start` makes a state (stored only as its SHA-256) and a PKCE verifier (sealed, bound to the
flow's id) and answers the provider's authorize URL. `finish` consumes the state once,
exchanges the code with the verifier, seals the pair for the connection's id and stores it;
a reconnect (same workspace, provider and account) repairs the existing connection and wakes
every run parked on it.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import uuid
from dataclasses import dataclass

from control_plane.connections.client import (
    GrantRefused,
    OAuthClient,
    ProviderUnreachable,
    TokenAnswer,
    new_verifier,
)
from control_plane.connections.tokens import ConnectionTokens, ConnectionUnavailable
from control_plane.crypto.envelope import CONNECTION_TOKEN, Envelope
from control_plane.ground.errors import FailedPrecondition, InvalidArgument
from control_plane.store import connections as store
from control_plane.store.connections import Flow
from control_plane.store.db import Pool

FLOW_TTL_SECONDS = 600.0
PROVIDER = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
SCOPE = re.compile(r"^[A-Za-z0-9_.:/-]{1,100}$")
CALLBACK_PATH = "/connections/callback"


def default_scopes(provider: str) -> list[str]:
    return [f"{provider}:read", f"{provider}:write"]


def state_digest(state: str) -> bytes:
    return hashlib.sha256(state.encode()).digest()


@dataclass(frozen=True)
class Finished:
    workspace_id: str
    connection_id: str
    provider: str
    account: str
    scopes: tuple[str, ...]
    reconnected: bool
    woken: list[str]


class ConnectionFlows:
    def __init__(
        self,
        pool: Pool,
        envelope: Envelope,
        client: OAuthClient,
        tokens: ConnectionTokens,
        public_url: str,
    ) -> None:
        self.pool, self.envelope, self.client, self.tokens = pool, envelope, client, tokens
        self.redirect_uri = f"{public_url}{CALLBACK_PATH}"

    async def start(
        self,
        workspace_id: str,
        provider: str,
        owner: str,
        scopes: list[str],
        connection_id: str | None = None,
        login_hint: str = "",
    ) -> str:
        """The provider's authorize URL for a new flow (kept server-side until its callback)."""
        _check_start(provider, scopes)
        state, verifier, flow_id = secrets.token_urlsafe(32), new_verifier(), str(uuid.uuid4())
        sealed = await self.envelope.seal(
            workspace_id, CONNECTION_TOKEN, f"flow:{flow_id}", verifier.encode()
        )
        flow = Flow(
            workspace_id, flow_id, provider, owner, tuple(scopes), sealed, connection_id, True
        )
        await store.insert_flow(self.pool, state_digest(state), flow, FLOW_TTL_SECONDS)
        return self.client.authorize_url(
            provider,
            state=state,
            verifier=verifier,
            scopes=scopes,
            redirect_uri=self.redirect_uri,
            login_hint=login_hint,
        )

    async def finish(self, state: str, code: str) -> Finished:
        flow = await store.take_flow(self.pool, state_digest(state))
        if flow is None or not flow.live:
            raise InvalidArgument("state", "unknown, used or expired")
        verifier = await self.envelope.open(
            flow.workspace_id, CONNECTION_TOKEN, f"flow:{flow.flow_id}", flow.verifier_sealed
        )
        try:
            answer = await self.client.exchange(
                flow.provider, code, verifier.decode(), self.redirect_uri
            )
        except GrantRefused as exc:
            raise FailedPrecondition(f"the provider refused the code: {exc.error}") from None
        except ProviderUnreachable as exc:
            raise ConnectionUnavailable(str(exc)) from None
        account = answer.account or f"unknown@{flow.provider}"
        stored = await self._store(flow, account, answer)
        woken = await store.wake_waiting(self.pool, flow.workspace_id, stored[0])
        return Finished(
            flow.workspace_id,
            stored[0],
            flow.provider,
            account,
            tuple(answer.scopes or flow.scopes),
            stored[1],
            woken,
        )

    async def _store(self, flow: Flow, account: str, answer: TokenAnswer) -> tuple[str, bool]:
        for _ in range(3):  # a racing callback for the same account may own the row
            existing = await store.find(self.pool, flow.workspace_id, flow.provider, account)
            cid = existing or str(uuid.uuid4())
            pair = await self.tokens.seal(flow.workspace_id, cid, answer)
            if pair.scopes is None:
                pair = store.NewPair(
                    pair.access_sealed, pair.refresh_sealed, pair.expires_in, list(flow.scopes)
                )
            done = await store.upsert(
                self.pool, flow.workspace_id, flow.provider, account, flow.owner, pair, cid
            )
            if done is not None:
                return done
        raise ConnectionUnavailable("the connection changed during the callback: retry")


def _check_start(provider: str, scopes: list[str]) -> None:
    if not PROVIDER.match(provider):
        raise InvalidArgument("provider", "must be a provider name")
    if not scopes or len(scopes) > 20:
        raise InvalidArgument("scope", "must name 1 to 20 scopes")
    for scope in scopes:
        if not SCOPE.match(scope):
            raise InvalidArgument("scope", "has a malformed scope")
