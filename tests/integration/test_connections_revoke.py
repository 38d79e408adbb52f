"""Revoking a connection through our API revokes its grant at the provider too (RFC 7009);
a provider that fails still leaves the connection revoked here, with the failure recorded and
no token anywhere in what is recorded or answered."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import httpx

from agentrun.v1 import connection_pb2 as pb
from agentrun.v1 import connection_pb2_grpc
from control_plane.server import RunningServer
from sandbox.serve import BackgroundServer
from tests.harness.auth import channel, workspace_key
from tests.integration.test_connections import WS, connect, cp, oauth_sandbox, tokens_for

__all__ = ["cp", "oauth_sandbox"]  # the fixtures this module uses


def oauth(sandbox: BackgroundServer, method: str, path: str, body: Any = None) -> Any:
    answer = httpx.request(method, f"{sandbox.url}{path}", json=body)
    answer.raise_for_status()
    return answer.json()


def grant_of(sandbox: BackgroundServer, account: str) -> dict[str, Any]:
    (grant,) = [
        g
        for g in oauth(sandbox, "GET", "/_sandbox/oauth/stats")["grants"]
        if g["account"] == account
    ]
    return grant


async def revoke(cp: RunningServer, key: str, connection_id: str) -> pb.Connection:
    async with channel(f"127.0.0.1:{cp.port}", key) as ch:
        stub = connection_pb2_grpc.ConnectionServiceStub(ch)
        answer = await stub.RevokeConnection(
            pb.RevokeConnectionRequest(workspace_id=WS, connection_id=connection_id)
        )
    return answer.connection


async def audited(db_url: str, connection_id: str) -> list[dict[str, Any]]:
    conn = await asyncpg.connect(db_url)
    try:
        rows = await conn.fetch(
            "SELECT action, detail::text AS detail FROM audit_log"
            " WHERE workspace_id = $1 AND object_id = $2 AND action = 'connection.revoked'",
            WS,
            connection_id,
        )
    finally:
        await conn.close()
    return [{"action": r["action"], "detail": json.loads(r["detail"])} for r in rows]


async def test_revoking_a_connection_revokes_its_grant_at_the_provider(
    cp: RunningServer, db_url: str, oauth_sandbox: BackgroundServer
) -> None:
    key = await workspace_key(db_url, WS, role="admin")
    cid = (await connect(cp, key, "rita@acme"))["connection_id"]
    assert grant_of(oauth_sandbox, "rita@acme")["revoked"] is False
    revoked = await revoke(cp, key, cid)
    assert (revoked.status, revoked.status_reason) == ("revoked", "revoked by workspace")
    assert grant_of(oauth_sandbox, "rita@acme")["revoked"] is True
    stats = oauth(oauth_sandbox, "GET", "/_sandbox/oauth/stats")
    assert (stats["revoke_calls"], stats["revocations"]) == (1, 1)
    (entry,) = await audited(db_url, cid)
    assert entry["detail"] == {"provider_revoked": True, "provider": "revoked"}
    # Revoking again changes nothing and asks the provider nothing (no token is held now).
    assert (await revoke(cp, key, cid)).status == "revoked"
    assert oauth(oauth_sandbox, "GET", "/_sandbox/oauth/stats")["revoke_calls"] == 1
    assert len(await audited(db_url, cid)) == 1


async def test_a_provider_that_cannot_revoke_still_leaves_the_connection_revoked_here(
    cp: RunningServer, db_url: str, oauth_sandbox: BackgroundServer
) -> None:
    key = await workspace_key(db_url, WS, role="admin")
    cid = (await connect(cp, key, "sam@acme"))["connection_id"]
    token = (await tokens_for(cp.pool, oauth_sandbox).for_call(WS, cid)).access_token
    oauth(oauth_sandbox, "POST", "/_sandbox/oauth/config", {"fail_revocations": 1})
    revoked = await revoke(cp, key, cid)
    assert revoked.status == "revoked"
    assert "at the provider: revocation failed" in revoked.status_reason
    assert "HTTP 503" in revoked.status_reason
    # The grant may live on at the provider: that is what the record says.
    assert grant_of(oauth_sandbox, "sam@acme")["revoked"] is False
    (entry,) = await audited(db_url, cid)
    assert entry["detail"]["provider_revoked"] is False
    for shown in (str(revoked), str(entry)):
        assert token not in shown
