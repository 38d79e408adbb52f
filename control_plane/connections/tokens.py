"""A connection's access token for a call about to leave, refreshed single-flight.

`ConnectionTokens.for_call(ws, connection_id)` answers the current access token when it is
not due (expired, or within `margin` seconds of it). When it is due, one refresh runs per
connection:

* in this replica, one task per connection; every caller awaits it;
* across replicas, a Postgres advisory lock held by a transaction that holds no row lock
  (`pg_advisory_xact_lock`, with `lock_timeout`): whoever gets it re-reads the row and
  refreshes only if it is still due; the others wait for the lock, re-read, and find the
  new pair. The pair is written (sealed, guarded by its generation) in its own statement
  before the lock is released, so it is durable the moment anyone can see it.

A crash mid-refresh releases the lock with the session, so nothing is stranded. What it can
lose is the provider's answer: the provider rotated the pair but we never stored it. The next
attempt presents the refresh token we still hold. A provider with a reuse interval (Auth0,
Okta; the sandbox's `reuse_grace_seconds`) answers the same rotation again and nothing is
lost. A strict RFC 9700 provider sees reuse and revokes the grant: the connection becomes
`needs_reauth` and its owner is asked to reconnect — loud, not silent, but a reconnect. A
dropped response is retried once in-process for the same reason.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import datetime

import grpc

from control_plane.connections.client import (
    GrantRefused,
    OAuthClient,
    ProviderUnreachable,
    TokenAnswer,
)
from control_plane.crypto.envelope import CONNECTION_TOKEN, Envelope
from control_plane.ground.errors import DomainError, FailedPrecondition, NotFound
from control_plane.store import connections as store
from control_plane.store.connections import NewPair, RefreshBusy, StoredConnection
from control_plane.store.db import Pool, transaction

log = logging.getLogger(__name__)

REFRESH_MARGIN_SECONDS = 30.0
LOCK_TIMEOUT_SECONDS = 15.0


class ConnectionUnusable(FailedPrecondition):
    """The connection is revoked, expired or needs its owner to connect again."""

    def __init__(self, connection_id: str, status: str) -> None:
        super().__init__(f"connection {connection_id} is {status}")
        self.connection_id, self.status = connection_id, status


class ConnectionUnavailable(DomainError):
    """The provider's token endpoint or the refresh lock did not answer in time: retry."""

    code = grpc.StatusCode.UNAVAILABLE


@dataclass(frozen=True)
class CallToken:
    connection_id: str
    provider: str
    account: str
    scopes: tuple[str, ...]
    expires_at: datetime | None
    access_token: str = field(repr=False)
    generation: int = 0


def token_id(connection_id: str, which: str) -> str:
    """The object id a token is sealed under: the connection and which of its tokens."""
    return f"{connection_id}:{which}"


class ConnectionTokens:
    def __init__(
        self,
        pool: Pool,
        envelope: Envelope,
        client: OAuthClient,
        *,
        margin: float = REFRESH_MARGIN_SECONDS,
        lock_timeout: float = LOCK_TIMEOUT_SECONDS,
    ) -> None:
        self.pool, self.envelope, self.client = pool, envelope, client
        self.margin, self.lock_timeout = margin, lock_timeout
        self._inflight: dict[tuple[str, str], asyncio.Task[StoredConnection | None]] = {}

    async def seal(self, workspace_id: str, connection_id: str, answer: TokenAnswer) -> NewPair:
        access = await self.envelope.seal(
            workspace_id,
            CONNECTION_TOKEN,
            token_id(connection_id, "access"),
            answer.access_token.encode(),
        )
        refresh = None
        if answer.refresh_token is not None:
            refresh = await self.envelope.seal(
                workspace_id,
                CONNECTION_TOKEN,
                token_id(connection_id, "refresh"),
                answer.refresh_token.encode(),
            )
        return NewPair(access, refresh, answer.expires_in, answer.scopes)

    async def for_call(self, workspace_id: str, connection_id: str) -> CallToken:
        """The access token to put on a call that is about to leave (refreshed if due)."""
        row = await store.get(self.pool, workspace_id, connection_id, self.margin)
        if row is not None and row.status == "active" and row.due:
            row = await self._refreshed(workspace_id, connection_id)
        if row is None:
            raise NotFound(f"connection {connection_id} not found")
        if row.status != "active" or row.access_sealed is None:
            raise ConnectionUnusable(connection_id, row.status)
        if row.due:  # refreshed by nobody: the provider did not answer
            raise ConnectionUnavailable(f"connection {connection_id}: refresh did not finish")
        access = await self.envelope.open(
            workspace_id, CONNECTION_TOKEN, token_id(connection_id, "access"), row.access_sealed
        )
        return CallToken(
            connection_id,
            row.provider,
            row.account,
            row.scopes,
            row.access_expires_at,
            access.decode(),
            row.token_generation,
        )

    async def after_rejection(self, workspace_id: str, token: CallToken) -> CallToken:
        """The provider answered 401 to `token` before it was due (revoked early, or its
        clock differs): refresh it through the same single-flight path, once, and answer the
        new token. If someone refreshed meanwhile, theirs is answered without another refresh."""
        await store.mark_stale(self.pool, workspace_id, token.connection_id, token.generation)
        return await self.for_call(workspace_id, token.connection_id)

    async def _refreshed(self, workspace_id: str, connection_id: str) -> StoredConnection | None:
        key = (workspace_id, connection_id)
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.create_task(self._refresh(workspace_id, connection_id))
            self._inflight[key] = task
            task.add_done_callback(lambda _: self._inflight.pop(key, None))
        return await asyncio.shield(task)

    async def _refresh(self, workspace_id: str, connection_id: str) -> StoredConnection | None:
        try:
            async with transaction(self.pool) as conn:
                await store.lock_refresh(conn, workspace_id, connection_id, self.lock_timeout)
                row = await store.get(conn, workspace_id, connection_id, self.margin)
                if row is not None and row.status == "active" and row.due:
                    await self._refresh_locked(row)
        except RefreshBusy as exc:
            raise ConnectionUnavailable(str(exc)) from None
        return await store.get(self.pool, workspace_id, connection_id, self.margin)

    async def _refresh_locked(self, row: StoredConnection) -> None:
        """Holding the lock: ask the provider, store the new pair before letting go."""
        ws, cid = row.workspace_id, row.connection_id
        if row.refresh_sealed is None:
            await store.set_status(self.pool, ws, cid, "expired", "no refresh token")
            return
        refresh = (
            await self.envelope.open(
                ws, CONNECTION_TOKEN, token_id(cid, "refresh"), row.refresh_sealed
            )
        ).decode()
        try:
            answer = await self._ask(row.provider, refresh)
        except GrantRefused as exc:
            log.info("connection %s: refresh refused (%s): needs reauth", cid, exc.error)
            await store.set_status(self.pool, ws, cid, "needs_reauth", exc.error)
            return
        except ProviderUnreachable as exc:
            log.warning("connection %s: refresh did not complete: %s", cid, exc)
            return
        pair = await self.seal(ws, cid, answer)
        if await store.store_pair(self.pool, ws, cid, row.token_generation, pair) is None:
            log.warning("connection %s changed during its refresh; the new pair is dropped", cid)

    async def _ask(self, provider: str, refresh: str) -> TokenAnswer:
        """Refresh, once more if the answer was lost (see the module docstring)."""
        try:
            return await self.client.refresh(provider, refresh)
        except ProviderUnreachable:
            return await self.client.refresh(provider, refresh)
