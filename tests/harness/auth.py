"""Credentials for tests, minted straight into the test database (as `agentrun admin` would).

    key = await workspace_key(db_url, "ws")                  # an admin key of workspace ws
    op = await workspace_key(db_url, "ws", role="operator")
    ex = await executor_key(db_url, scope=["ws-a"])          # None: every workspace

`workspace_key` creates the workspace when it does not exist yet (on the team plan).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg
import grpc

from control_plane.auth.credentials import KeyRequest, issue
from control_plane.store import identity as store
from tests.harness.secrets_seen import remember


async def _issue(db_url: str, req: KeyRequest, workspace: str | None = None) -> str:
    conn = await asyncpg.connect(db_url)
    try:
        if workspace is not None:
            await store.create_workspace(conn, workspace, "team", None)
        return remember((await issue(conn, req)).text)
    finally:
        await conn.close()


async def ensure_workspace(db_url: str, workspace: str) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        await store.create_workspace(conn, workspace, "team", None)
    finally:
        await conn.close()


async def workspace_key(
    db_url: str,
    workspace: str,
    role: str = "admin",
    principal: str = "tester",
    expires_at: datetime | None = None,
) -> str:
    """The text of a new `role` key of `workspace` (created if new) for `principal`."""
    req = KeyRequest("workspace", principal, "test-harness", workspace, role, None, expires_at)
    return await _issue(db_url, req, workspace)


async def executor_key(
    db_url: str, scope: Sequence[str] | None = None, principal: str = "test-executors"
) -> str:
    """The text of a new executor credential serving `scope` (None: every workspace)."""
    return await _issue(db_url, KeyRequest("executor", principal, "test-harness", scope=scope))


async def platform_key(db_url: str, principal: str = "platform-admin") -> str:
    return await _issue(db_url, KeyRequest("platform", principal, "test-harness"))


class _Bearer:
    """Adds `authorization: Bearer <key>` to a call's metadata."""

    def __init__(self, key: str) -> None:
        self._pair = ("authorization", f"Bearer {key}")

    def _details(self, details: Any) -> Any:
        metadata = [*(details.metadata or ()), self._pair]
        return details._replace(metadata=metadata)


class _UnaryUnary(_Bearer, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), request)


class _UnaryStream(_Bearer, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), request)


class _StreamStream(_Bearer, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, details, requests):  # type: ignore[no-untyped-def]
        return await continuation(self._details(details), requests)


def channel(
    address: str, key: str | None, tls: grpc.ChannelCredentials | None = None
) -> grpc.aio.Channel:
    """A channel (TLS with `tls`, else plaintext) that sends `key`, when given, as a bearer
    token on every call."""
    # grpc.aio files each interceptor under the first call type it implements: one per type.
    interceptors = [_UnaryUnary(key), _UnaryStream(key), _StreamStream(key)] if key else None
    if tls is not None:
        return grpc.aio.secure_channel(address, tls, interceptors=interceptors)
    return grpc.aio.insecure_channel(address, interceptors=interceptors)


def bearer(key: str) -> dict[str, str]:
    """The HTTP header that carries `key`."""
    return {"Authorization": f"Bearer {key}"}
