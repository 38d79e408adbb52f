"""A push source on its mailbox's own connection: the history API wants the connection's
access token, which the fetcher refreshes single-flight (when due, or once after a 401), and
a connection that cannot be used parks the fetch with its reason on the trigger."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import httpx
import pytest

from agentrun.v1 import trigger_pb2
from control_plane.connections.client import OAuthClient, OAuthSettings
from control_plane.connections.tokens import ConnectionTokens
from control_plane.crypto import kms
from control_plane.crypto.envelope import Envelope
from control_plane.ground.config import RunDefaults, ServerConfig
from control_plane.server import RunningServer
from control_plane.server import start as start_server
from control_plane.store import triggers as store
from control_plane.triggers import push
from sandbox.oauth import CLIENT_SECRET
from sandbox.providers import create_app
from sandbox.providers.mailbox import MailboxProvider
from sandbox.serve import BackgroundServer
from tests.harness.connections import follow_start_link
from tests.harness.triggers import TriggerApi, count, post, signed
from tests.harness.waiting import eventually

WS = "ws-push"
INBOX = "owner@acme.test"


@pytest.fixture
def mail_sandbox() -> Iterator[BackgroundServer]:
    """A mailbox whose history API requires a token its own OAuth server issued."""
    with BackgroundServer(create_app([MailboxProvider()])) as server:
        yield server


@pytest.fixture
async def cp(db_url: str, mail_sandbox: BackgroundServer) -> AsyncIterator[RunningServer]:
    config = ServerConfig(
        database_url=db_url,
        listen="127.0.0.1:0",
        notify_url=mail_sandbox.url,
        push_poll_seconds=0.2,
    )
    running = await start_server(config)
    yield running
    await running.stop(grace=0)


@pytest.fixture
async def api(cp: RunningServer, db_url: str) -> AsyncIterator[TriggerApi]:
    client = await TriggerApi.connect(f"127.0.0.1:{cp.port}", db_url, WS)
    await client.publish("triage")
    yield client
    await client.close()


async def sandbox(server: BackgroundServer, method: str, path: str, **kw: Any) -> Any:
    async with httpx.AsyncClient(base_url=server.url) as client:
        answer = await client.request(method, path, **kw)
        assert answer.status_code == 200, answer.text
        return answer.json()


async def fill(server: BackgroundServer, first: int, n: int) -> None:
    for i in range(first, first + n):
        message = {
            "message_id": f"<m{i}@mail.test>",
            "from": f"Sender {i} <sender{i}@example.com>",
            "to": [INBOX],
            "subject": f"Message {i}",
            "text": f"body {i}",
            "headers": {},
        }
        await sandbox(server, "POST", f"/mailbox/{INBOX}/messages", json=message)


async def notify(cp: RunningServer, secret: str, history_id: int) -> None:
    data = json.dumps({"emailAddress": INBOX, "historyId": history_id}).encode()
    note = {"message": {"data": base64.b64encode(data).decode(), "messageId": str(history_id)}}
    body, headers = signed("hmac_sha256", secret, note, "")
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{cp.http_port}") as client:
        assert (await post(client, WS, "inbox", body, headers)).status_code == 202


async def test_a_push_source_fetches_on_its_connection_refreshing_once_then_parks_when_revoked(
    cp: RunningServer, api: TriggerApi, db: Any, mail_sandbox: BackgroundServer
) -> None:
    # The mailbox's owner connected it; its access token has expired since.
    await sandbox(mail_sandbox, "POST", "/_sandbox/oauth/config", json={"access_ttl_seconds": 1})
    done = await follow_start_link(
        f"http://127.0.0.1:{cp.http_port}", WS, str(api.key), INBOX, provider="mailbox"
    )
    cid = str(done["connection_id"])
    await sandbox(mail_sandbox, "POST", "/_sandbox/oauth/config", json={"access_ttl_seconds": 3600})
    await sandbox(mail_sandbox, "POST", "/_sandbox/oauth/config", json={"require": {"mailbox": 1}})
    await sandbox(mail_sandbox, "DELETE", "/_sandbox/oauth/stats")
    await asyncio.sleep(1.1)  # expired at the provider too, not only by our margin
    url = f"{mail_sandbox.url}/mailbox/{INBOX}/history"
    _, secret = await api.create(
        "inbox", "triage", mail_push=trigger_pb2.MailPushSource(history_url=url, connection_id=cid)
    )

    async def fetched(cursor: int) -> bool:
        return await db.fetchval("SELECT last_history_id FROM triggers") == cursor

    await fill(mail_sandbox, 1, 3)
    await asyncio.gather(*(notify(cp, secret, 3) for _ in range(3)))
    await eventually(lambda: fetched(3), message="three messages fetched on the connection")
    stats = await sandbox(mail_sandbox, "GET", "/_sandbox/oauth/stats")
    assert (stats["token_calls"], stats["refresh_calls"]) == (1, 1)
    assert await count(db, "runs") == 3 and await count(db, "trigger_events") == 3
    calls = (await sandbox(mail_sandbox, "GET", "/_sandbox/requests"))["requests"]
    history = [c for c in calls if c["path"].endswith("/history")]
    assert history and all(c["status"] == 200 and c["token_id"] for c in history)

    # The same history again: announced (nothing queued) and refetched from the start
    # (every message deduped on its Message-ID): nothing more starts, no further refresh.
    await notify(cp, secret, 3)
    again = push.PushFetcher(cp.pool, RunDefaults(), lambda: None, tokens=cp_tokens(cp))
    row = await store.get_trigger(cp.pool, WS, "inbox")
    row = {**dict(row), "last_history_id": 0}
    result = await again.fetch(row)
    assert (result.messages, result.runs_started) == (3, 0)
    assert await count(db, "runs") == 3

    # The provider refuses the token before we think it due (a 401): one refresh, one retry.
    await sandbox(mail_sandbox, "POST", "/_sandbox/oauth/expire", json=grant(INBOX))
    await fill(mail_sandbox, 4, 1)
    await notify(cp, secret, 4)
    await eventually(lambda: fetched(4), message="the fourth message fetched after a 401")
    stats = await sandbox(mail_sandbox, "GET", "/_sandbox/oauth/stats")
    assert stats["refresh_calls"] == 2 and await count(db, "runs") == 4

    # The owner revoked the app: the fetch parks with the reason on the trigger.
    await sandbox(mail_sandbox, "POST", "/_sandbox/oauth/revoke", json=grant(INBOX))
    await fill(mail_sandbox, 5, 1)
    await notify(cp, secret, 5)

    async def parked() -> bool:
        row = await db.fetchrow("SELECT fetch_error, fetch_due_at FROM triggers")
        return row["fetch_error"] is not None and row["fetch_due_at"] is None

    await eventually(parked, message="the fetch parked on the unusable connection")
    got = await api.triggers.GetTrigger(
        trigger_pb2.GetTriggerRequest(workspace_id=WS, trigger_id="inbox")
    )
    assert cid in got.trigger.mail_push.fetch_error
    assert "needs_reauth" in got.trigger.mail_push.fetch_error
    assert got.trigger.mail_push.connection_id == cid
    refreshes = (await sandbox(mail_sandbox, "GET", "/_sandbox/oauth/stats"))["refresh_calls"]
    await asyncio.sleep(1.0)  # five poll intervals: no retry loop against the provider
    stats = await sandbox(mail_sandbox, "GET", "/_sandbox/oauth/stats")
    assert stats["refresh_calls"] == refreshes == 3
    assert (
        await count(db, "runs") == 4
        and await db.fetchval("SELECT last_history_id FROM triggers") == 4
    )


async def test_a_token_lacking_the_read_scope_parks_the_fetch_at_once(
    cp: RunningServer, api: TriggerApi, db: Any, mail_sandbox: BackgroundServer
) -> None:
    done = await follow_start_link(
        f"http://127.0.0.1:{cp.http_port}", WS, str(api.key), INBOX, provider="mailbox"
    )
    await sandbox(mail_sandbox, "POST", "/_sandbox/oauth/config", json={"require": {"mailbox": 1}})
    # The owner's grant lost the read scope: every token of it is refused (403), and a
    # refresh would not help (the same grant): parked, not retried every lease.
    await sandbox(
        mail_sandbox, "POST", "/_sandbox/oauth/scopes", json={**grant(INBOX), "scopes": []}
    )
    url = f"{mail_sandbox.url}/mailbox/{INBOX}/history"
    source = trigger_pb2.MailPushSource(history_url=url, connection_id=done["connection_id"])
    _, secret = await api.create("inbox", "triage", mail_push=source)
    await fill(mail_sandbox, 1, 1)
    await notify(cp, secret, 1)

    async def parked() -> bool:
        return bool(await db.fetchval("SELECT fetch_error FROM triggers"))

    await eventually(parked, message="parked on the refused token")
    error = await db.fetchval("SELECT fetch_error FROM triggers")
    assert "403" in error and await count(db, "runs") == 0
    assert await db.fetchval("SELECT fetch_due_at FROM triggers") is None


def grant(account: str) -> dict[str, str]:
    return {"provider": "mailbox", "account": account}


def cp_tokens(cp: RunningServer) -> ConnectionTokens:
    """Tokens as another replica would hold them (same database, same keys)."""
    client = OAuthClient(OAuthSettings(cp_oauth_url(cp), "agentrun", CLIENT_SECRET))
    return ConnectionTokens(
        cp.pool, Envelope(cp.pool, kms.configured("local", None, release="dev")), client
    )


def cp_oauth_url(cp: RunningServer) -> str:
    assert cp.oauth is not None
    return cp.oauth.settings.base_url


async def test_a_push_source_on_an_unknown_connection_is_refused(api: TriggerApi) -> None:
    source = trigger_pb2.MailPushSource(
        history_url="http://127.0.0.1:1/history",
        connection_id="00000000-0000-0000-0000-000000000001",
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await api.create("inbox", "triage", mail_push=source)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "mail_push.connection_id" in str(err.value.details())
    source.connection_id = "not-a-uuid"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await api.create("inbox", "triage", mail_push=source)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
