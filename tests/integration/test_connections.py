"""Connected accounts end to end: the PKCE flow through the HTTP ingress against the sandbox
OAuth server, ConnectionService, and single-flight refresh across replicas."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import grpc
import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

from agentrun.v1 import connection_pb2 as pb
from agentrun.v1 import connection_pb2_grpc, executor_pb2, executor_pb2_grpc
from control_plane.connections.client import OAuthClient, OAuthSettings, ProviderUnreachable
from control_plane.connections.tokens import ConnectionTokens, ConnectionUnusable
from control_plane.crypto import kms
from control_plane.crypto.envelope import Envelope
from control_plane.ground.config import ServerConfig
from control_plane.server import RunningServer
from control_plane.server import start as start_server
from control_plane.store.db import create_pool
from sandbox.oauth import CLIENT_SECRET
from sandbox.providers import create_app
from sandbox.serve import BackgroundServer
from tests.harness.auth import bearer, channel, executor_key, workspace_key
from tests.harness.connections import follow_start_link

WS = "ws-conn"


@pytest.fixture
def oauth_sandbox() -> Iterator[BackgroundServer]:
    """A providers sandbox of this test's own (its OAuth state and counters are ours)."""
    with BackgroundServer(create_app()) as server:
        yield server


@pytest.fixture
async def cp(db_url: str, oauth_sandbox: BackgroundServer) -> AsyncIterator[RunningServer]:
    config = ServerConfig(database_url=db_url, listen="127.0.0.1:0", notify_url=oauth_sandbox.url)
    running = await start_server(config)
    yield running
    await running.stop(grace=0)


async def sandbox(oauth_sandbox: BackgroundServer, method: str, path: str, **kw: Any) -> Any:
    async with httpx.AsyncClient(base_url=oauth_sandbox.url) as client:
        answer = await client.request(method, path, **kw)
        return answer.json()


async def connect(cp: RunningServer, key: str, account: str, **query: str) -> dict[str, Any]:
    """Follow the start link, the sandbox's consent and the callback, as a browser would."""
    return await follow_start_link(f"http://127.0.0.1:{cp.http_port}", WS, key, account, **query)


def tokens_for(pool: Any, oauth_sandbox: BackgroundServer) -> ConnectionTokens:
    client = OAuthClient(OAuthSettings(oauth_sandbox.url, "agentrun", CLIENT_SECRET))
    return ConnectionTokens(
        pool, Envelope(pool, kms.configured("local", None, release="dev")), client
    )


async def test_the_pkce_flow_stores_a_sealed_connection_and_the_api_never_shows_tokens(
    cp: RunningServer,
    db_url: str,
    oauth_sandbox: BackgroundServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("DEBUG")
    key = await workspace_key(db_url, WS, role="operator")
    done = await connect(cp, key, "ada@acme")
    assert done["account"] == "ada@acme" and done["status"] == "active"
    assert done["scopes"] == ["chat:read", "chat:write"]
    token = await tokens_for(cp.pool, oauth_sandbox).for_call(WS, done["connection_id"])
    # The token works at the provider, as the connected account.
    async with httpx.AsyncClient(base_url=oauth_sandbox.url) as client:
        posted = await client.post(
            "/chat/messages",
            json={"channel": "#general", "text": "hi"},
            headers={"Authorization": f"Bearer {token.access_token}"},
        )
    assert posted.status_code == 200
    async with channel(f"127.0.0.1:{cp.port}", key) as ch:
        stub = connection_pb2_grpc.ConnectionServiceStub(ch)
        listed = await stub.ListConnections(pb.ListConnectionsRequest(workspace_id=WS))
        got = await stub.GetConnection(
            pb.GetConnectionRequest(workspace_id=WS, connection_id=done["connection_id"])
        )
        link = await stub.GetReconnectLink(
            pb.GetReconnectLinkRequest(workspace_id=WS, connection_id=done["connection_id"])
        )
    assert [c.account for c in listed.connections] == ["ada@acme"]
    assert got.connection.status == "active" and got.connection.owner.endswith(":tester")
    assert "connection_id=" in link.url
    for shown in (str(done), str(listed), str(got), str(link), repr(token), caplog.text):
        assert token.access_token not in shown
        assert CLIENT_SECRET not in shown
    conn = await asyncpg.connect(db_url)
    try:
        raw = await conn.fetchrow("SELECT * FROM connections")
        assert token.access_token.encode() not in bytes(raw["access_sealed"])
        assert token.access_token not in str(dict(raw))
    finally:
        await conn.close()


async def test_a_state_works_once_and_a_forged_one_not_at_all(
    cp: RunningServer, db_url: str
) -> None:
    key = await workspace_key(db_url, WS, role="operator")
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{cp.http_port}") as client:
        start = await client.get(f"/connections/{WS}/chat/start", headers=bearer(key))
        consent = await client.get(start.headers["location"])
        back = urlsplit(consent.headers["location"])
        assert (await client.get(f"{back.path}?{back.query}")).status_code == 200
        again = await client.get(f"{back.path}?{back.query}")
        assert again.status_code == 400 and "state" in again.json()["error"]
        forged = await client.get("/connections/callback", params={"state": "x", "code": "y"})
        assert forged.status_code == 400
        anonymous = await client.get(f"/connections/{WS}/chat/start")
        assert anonymous.status_code == 401
        bad_scope = await client.get(
            f"/connections/{WS}/chat/start", params={"scope": "bad scope!"}, headers=bearer(key)
        )
        assert bad_scope.status_code == 400


async def test_revoking_a_connection_drops_its_tokens(
    cp: RunningServer, db_url: str, oauth_sandbox: BackgroundServer
) -> None:
    key = await workspace_key(db_url, WS, role="admin")
    done = await connect(cp, key, "bob@acme")
    async with channel(f"127.0.0.1:{cp.port}", key) as ch:
        stub = connection_pb2_grpc.ConnectionServiceStub(ch)
        revoked = await stub.RevokeConnection(
            pb.RevokeConnectionRequest(workspace_id=WS, connection_id=done["connection_id"])
        )
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await stub.GetConnection(pb.GetConnectionRequest(workspace_id=WS, connection_id="nope"))
    assert revoked.connection.status == "revoked"
    assert missing.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(ConnectionUnusable):
        await tokens_for(cp.pool, oauth_sandbox).for_call(WS, done["connection_id"])


async def hundred_calls(
    db_url: str, cp: RunningServer, oauth_sandbox: BackgroundServer, connection_id: str
) -> list[str]:
    """100 calls at once over two replicas (two pools): the access token each got."""
    other = await create_pool(db_url, min_size=1, max_size=10)
    try:
        replicas = [tokens_for(cp.pool, oauth_sandbox), tokens_for(other, oauth_sandbox)]
        got = await asyncio.gather(
            *(replicas[i % 2].for_call(WS, connection_id) for i in range(100))
        )
    finally:
        await other.close()
    return [t.access_token for t in got]


async def expired_connection(
    cp: RunningServer, db_url: str, oauth_sandbox: BackgroundServer, account: str
) -> str:
    """A connection whose access token is already due, whose refresh will be long-lived."""
    await sandbox(oauth_sandbox, "POST", "/_sandbox/oauth/config", json={"access_ttl_seconds": 1})
    key = await workspace_key(db_url, WS, role="operator")
    done = await connect(cp, key, account)
    await sandbox(
        oauth_sandbox, "POST", "/_sandbox/oauth/config", json={"access_ttl_seconds": 3600}
    )
    await sandbox(oauth_sandbox, "DELETE", "/_sandbox/oauth/stats")
    return str(done["connection_id"])


async def carried(oauth_sandbox: BackgroundServer, tokens: list[str]) -> set[str]:
    """Post with every token; the token ids (grant/generation) the provider saw."""
    async with httpx.AsyncClient(base_url=oauth_sandbox.url) as client:
        await client.delete("/_sandbox/requests")
        answers = await asyncio.gather(
            *(
                client.post(
                    "/chat/messages",
                    json={"channel": "#general", "text": "x"},
                    headers={"Authorization": f"Bearer {t}"},
                )
                for t in tokens
            )
        )
        assert [a.status_code for a in answers] == [200] * len(tokens)
        log = (await client.get("/_sandbox/requests")).json()["requests"]
    return {entry["token_id"] for entry in log}


async def test_a_hundred_calls_on_an_expired_token_refresh_exactly_once(
    cp: RunningServer, db_url: str, oauth_sandbox: BackgroundServer
) -> None:
    cid = await expired_connection(cp, db_url, oauth_sandbox, "cara@acme")
    got = await hundred_calls(db_url, cp, oauth_sandbox, cid)
    stats = await sandbox(oauth_sandbox, "GET", "/_sandbox/oauth/stats")
    assert stats["token_calls"] == 1 and stats["reuse_revocations"] == 0
    assert len(set(got)) == 1
    token_ids = await carried(oauth_sandbox, got)
    assert len(token_ids) == 1 and next(iter(token_ids)).endswith("/2")


async def test_a_lost_refresh_response_recovers_with_a_reuse_interval(
    cp: RunningServer, db_url: str, oauth_sandbox: BackgroundServer
) -> None:
    cid = await expired_connection(cp, db_url, oauth_sandbox, "dan@acme")
    await sandbox(oauth_sandbox, "POST", "/_sandbox/oauth/config", json={"reuse_grace_seconds": 30})
    await sandbox(oauth_sandbox, "POST", "/_sandbox/oauth/drop_refresh", json={"times": 1})
    got = await hundred_calls(db_url, cp, oauth_sandbox, cid)
    stats = await sandbox(oauth_sandbox, "GET", "/_sandbox/oauth/stats")
    # The dropped answer and its one retry; the provider answered the same rotation again.
    assert stats["token_calls"] == 2 and stats["reuse_revocations"] == 0
    assert len(set(got)) == 1
    assert len(await carried(oauth_sandbox, got)) == 1


async def test_a_lost_refresh_response_at_a_strict_provider_needs_reauth_loudly(
    cp: RunningServer, db_url: str, oauth_sandbox: BackgroundServer
) -> None:
    cid = await expired_connection(cp, db_url, oauth_sandbox, "eve@acme")
    await sandbox(oauth_sandbox, "POST", "/_sandbox/oauth/drop_refresh", json={"times": 1})
    tokens = tokens_for(cp.pool, oauth_sandbox)
    with pytest.raises(ConnectionUnusable) as unusable:
        await tokens.for_call(WS, cid)
    assert unusable.value.status == "needs_reauth"
    stats = await sandbox(oauth_sandbox, "GET", "/_sandbox/oauth/stats")
    assert stats["reuse_revocations"] == 1  # the provider revoked the grant: RFC 9700


async def test_a_refresher_that_dies_holding_the_lock_strands_nothing(
    cp: RunningServer, db_url: str, oauth_sandbox: BackgroundServer
) -> None:
    cid = await expired_connection(cp, db_url, oauth_sandbox, "fay@acme")
    doomed = await asyncpg.connect(db_url)
    await doomed.execute("BEGIN")
    await doomed.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('connection_refresh:' || $1 || ':' || $2, 0))",
        WS,
        cid,
    )
    pid = doomed.get_server_pid()
    call = asyncio.create_task(tokens_for(cp.pool, oauth_sandbox).for_call(WS, cid))
    await asyncio.wait({call}, timeout=0.5)
    assert not call.done()  # waiting on the lock a "crashed" replica holds
    admin = await asyncpg.connect(db_url)
    try:
        # (Typed: Citus adds pg_terminate_backend(bigint), for its global pids, beside
        # PostgreSQL's int one, and an untyped parameter then matches both.)
        await admin.execute("SELECT pg_terminate_backend($1::int)", pid)
    finally:
        await admin.close()
    token = await asyncio.wait_for(call, timeout=10)
    assert token.access_token
    stats = await sandbox(oauth_sandbox, "GET", "/_sandbox/oauth/stats")
    assert stats["token_calls"] == 1 and stats["reuse_revocations"] == 0


async def test_an_executor_gets_no_token_for_a_run_it_does_not_hold(
    cp: RunningServer, db_url: str
) -> None:
    key = await workspace_key(db_url, WS, role="operator")
    done = await connect(cp, key, "gil@acme")
    lease = executor_pb2.Lease(workspace_id=WS, run_id=str(uuid.uuid4()), epoch=1)
    request = executor_pb2.GetConnectionTokenRequest(
        lease=lease, connection_id=done["connection_id"]
    )
    for who in (await executor_key(db_url), key, await executor_key(db_url, scope=["other"])):
        async with channel(f"127.0.0.1:{cp.port}", who) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await executor_pb2_grpc.ExecutorServiceStub(ch).GetConnectionToken(request)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_a_token_row_copied_to_another_workspace_does_not_open(
    cp: RunningServer, db_url: str, oauth_sandbox: BackgroundServer
) -> None:
    from control_plane.crypto.envelope import CONNECTION_TOKEN, CannotOpen
    from control_plane.store.identity import create_workspace

    key = await workspace_key(db_url, WS, role="operator")
    done = await connect(cp, key, "hank@acme")
    cid = done["connection_id"]
    conn = await asyncpg.connect(db_url)
    try:
        await create_workspace(conn, "ws-thief", "team", None)
        sealed = await conn.fetchval(
            "SELECT access_sealed FROM connections WHERE connection_id = $1", uuid.UUID(cid)
        )
    finally:
        await conn.close()
    envelope = Envelope(cp.pool, kms.configured("local", None, release="dev"))
    assert await envelope.open(WS, CONNECTION_TOKEN, f"{cid}:access", sealed)
    for ws, object_id in (("ws-thief", f"{cid}:access"), (WS, f"{cid}:refresh")):
        with pytest.raises(CannotOpen):
            await envelope.open(ws, CONNECTION_TOKEN, object_id, sealed)


# Token answers as a provider may garble them (real HTTP), and what the client makes of each:
# a TokenAnswer with the garbled fields left out, or ProviderUnreachable (no usable token).
# Before, a non-numeric expires_in was a TypeError or ValueError out of the refresh, NaN an
# expiry of NaN, a lone surrogate a token Postgres cannot take, and a body nested 50,000 deep
# a RecursionError.
GARBLED_ANSWERS: list[tuple[bytes, Any]] = [
    (b'{"access_token": "at", "expires_in": "abc"}', (3600.0, None, None, "")),
    (b'{"access_token": "at", "expires_in": [1], "scope": 5}', (3600.0, None, None, "")),
    (b'{"access_token": "at", "expires_in": NaN}', (3600.0, None, None, "")),
    (b'{"access_token": "at", "expires_in": -5, "refresh_token": {}}', (3600.0, None, None, "")),
    (b'{"access_token": "at", "expires_in": 1e400}', (3600.0, None, None, "")),
    (b'{"access_token": "at", "expires_in": "120"}', (120.0, None, None, "")),
    (b'{"access_token": "at", "expires_in": 1e12}', (365 * 86400.0, None, None, "")),
    (
        b'{"access_token": "at", "refresh_token": "r\\u0000t", "account": "\\ud83d",'
        b' "scope": "a b"}',
        (3600.0, None, ["a", "b"], ""),
    ),
    (b'{"access_token": "a\\ud83dt"}', "unreachable"),
    (b'{"access_token": "a\\u0000t"}', "unreachable"),
    (b'{"access_token": 12}', "unreachable"),
    (b"[" * 50_000 + b"]" * 50_000, "unreachable"),
]


async def test_a_garbled_token_answer_is_read_field_by_field_or_is_no_token() -> None:
    answers = iter(GARBLED_ANSWERS)

    async def token(_request: Any) -> Response:
        return Response(next(answers)[0], media_type="application/json")

    app = Starlette(routes=[Route("/oauth/{provider}/token", token, methods=["POST"])])
    with BackgroundServer(app) as provider:
        client = OAuthClient(OAuthSettings(provider.url, "agentrun", "secret"))
        try:
            for body, expected in GARBLED_ANSWERS:
                if expected == "unreachable":
                    with pytest.raises(ProviderUnreachable):
                        await client.refresh("chat", "rt")
                    continue
                answer = await client.refresh("chat", "rt")
                got = (answer.expires_in, answer.refresh_token, answer.scopes, answer.account)
                assert (answer.access_token, got) == ("at", expected), body[:80]
        finally:
            await client.close()
