"""Tool calls as a connected account, against the real provider sandbox app (in a thread):
the token goes on the Authorization header, fetched right before the request; a grant short
of the tool's scope stops the call before anything is sent; a refused token parks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from executor.config import ExecutorConfig
from executor.ratelimit.limiter import RateLimiter
from executor.ratelimit.token_bucket import connection_key
from executor.tools.catalogue import Catalogue
from executor.tools.credentials import ConnectionUnusable, Credential, Granted, for_tool
from executor.tools.http_tool import HttpToolClient
from sandbox.oauth import CLIENT_ID, CLIENT_SECRET, s256
from sandbox.providers import create_app
from sandbox.serve import BackgroundServer

CATALOGUE = Catalogue.load()
CHAT = CATALOGUE.get("chat_post")
POST = {"channel": "#general", "text": "hello"}
REDIRECT = "http://cp.test/connections/callback"


@pytest.fixture(scope="module")
def providers() -> Iterator[BackgroundServer]:
    with BackgroundServer(create_app()) as server:
        yield server


def grant(url: str, account: str, scope: str) -> dict[str, Any]:
    """A token pair from the sandbox's OAuth server (the control plane's part, done by hand)."""
    verifier = "v" * 48
    consent = httpx.get(
        f"{url}/oauth/chat/authorize",
        params={
            "response_type": "code",
            "client_id": CLIENT_ID,
            "redirect_uri": REDIRECT,
            "scope": scope,
            "state": "s",
            "code_challenge": s256(verifier),
            "code_challenge_method": "S256",
            "login_hint": account,
        },
    )
    code = httpx.URL(consent.headers["location"]).params["code"]
    pair = httpx.post(
        f"{url}/oauth/chat/token",
        data={
            "grant_type": "authorization_code",
            "code": code,
            "code_verifier": verifier,
            "redirect_uri": REDIRECT,
            "client_id": CLIENT_ID,
            "client_secret": CLIENT_SECRET,
        },
    )
    return pair.json()


def sandbox_get(url: str, path: str) -> Any:
    """A sandbox inspection read (sync, beside the client under test)."""
    return httpx.get(f"{url}{path}").json()


def revoke(url: str, account: str) -> None:
    httpx.post(f"{url}/_sandbox/oauth/revoke", json={"provider": "chat", "account": account})


def fetcher(pair: dict[str, Any], asked: list[str]):
    async def fetch(connection_id: str) -> Granted:
        asked.append(connection_id)
        return Granted(tuple(pair["scope"].split()), pair["access_token"])

    return fetch


async def test_the_call_carries_the_connections_token(providers: BackgroundServer) -> None:
    assert CHAT is not None
    pair = grant(providers.url, "ada@acme", "chat:write")
    asked: list[str] = []
    credential = for_tool({"chat": "conn-1"}, CHAT, fetcher(pair, asked))
    assert credential is not None and pair["access_token"] not in repr(credential)
    client = HttpToolClient(ExecutorConfig(providers_url=providers.url))
    try:
        answer = await client.send(CHAT, POST, "run-1:3", credential)
    finally:
        await client.aclose()
    assert answer["ok"] is True and asked == ["conn-1"]
    entry = sandbox_get(providers.url, "/_sandbox/requests")["requests"][-1]
    assert entry["account"] == "ada@acme" and entry["idempotency_key"] == "run-1:3"


async def test_a_grant_without_the_tools_scope_stops_before_sending(
    providers: BackgroundServer,
) -> None:
    assert CHAT is not None
    pair = grant(providers.url, "bo@acme", "chat:read")
    credential = for_tool({"chat": "conn-2"}, CHAT, fetcher(pair, []))
    client = HttpToolClient(ExecutorConfig(providers_url=providers.url))
    before = len(sandbox_get(providers.url, "/_sandbox/requests")["requests"])
    try:
        with pytest.raises(ConnectionUnusable, match="chat:write") as refused:
            await client.send(CHAT, POST, "run-2:3", credential)
    finally:
        await client.aclose()
    assert refused.value.connection_id == "conn-2"
    assert len(sandbox_get(providers.url, "/_sandbox/requests")["requests"]) == before


async def test_a_token_the_provider_refuses_is_unusable_and_never_quoted(
    providers: BackgroundServer,
) -> None:
    assert CHAT is not None
    pair = grant(providers.url, "cy@acme", "chat:write")
    revoke(providers.url, "cy@acme")
    credential = Credential("conn-3", fetcher(pair, []), "chat:write")
    client = HttpToolClient(ExecutorConfig(providers_url=providers.url))
    try:
        with pytest.raises(ConnectionUnusable) as refused:
            await client.send(CHAT, POST, "run-3:3", credential)
    finally:
        await client.aclose()
    assert pair["access_token"] not in str(refused.value)
    effects = sandbox_get(providers.url, "/_sandbox/effects?provider=chat")["effects"]
    assert all(e["key"] != "run-3:3" for e in effects)  # refused before it acted


def test_rate_limit_buckets_are_the_real_connections() -> None:
    assert CHAT is not None
    limiter = RateLimiter(None)
    own = limiter.buckets_for(CHAT, "6f1c0d4e-0000-4000-8000-000000000001")[0]
    shared = limiter.buckets_for(CHAT)[0]
    assert own.key == connection_key("chat", "6f1c0d4e-0000-4000-8000-000000000001")
    assert shared.key == connection_key("chat", "default") != own.key
