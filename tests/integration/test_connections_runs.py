"""Runs acting as connected accounts, with real processes: a control plane, an executor, the
provider sandbox (its OAuth server and chat provider) and Postgres.

Each test connects its own account (accounts are the sandbox's shared state)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from typing import Any

import asyncpg
import httpx
import pytest

from agentrun.v1 import agent_pb2, connection_pb2, connection_pb2_grpc, run_pb2
from tests.harness.agentrun_api import Api, sandbox_requests
from tests.harness.auth import workspace_key
from tests.harness.connections import follow_start_link
from tests.harness.waiting import eventually

WS = "ws"


@pytest.fixture
async def stack(db_url, control_plane):
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url, WS)
    yield cp, api
    await api.close()


async def connect(cp: Any, db_url: str, account: str, **query: str) -> str:
    """Follow the start link, the sandbox's consent and the callback; the connection id."""
    key = await workspace_key(db_url, WS, role="operator", principal="owner")
    done = await follow_start_link(cp.http_url, WS, key, account, **query)
    return str(done["connection_id"])


async def publish_poster(api: Api, agent_id: str, connection_id: str) -> None:
    await api.agents.CreateAgent(agent_pb2.CreateAgentRequest(workspace_id=WS, agent_id=agent_id))
    spec = agent_pb2.AgentSpec(
        model="poster",
        instructions="post",
        tools=["chat_post"],
        connections={"chat": connection_id},
    )
    await api.agents.PublishAgentVersion(
        agent_pb2.PublishAgentVersionRequest(workspace_id=WS, agent_id=agent_id, spec=spec)
    )


def mine(url: str, run_ids: list[str]) -> list[dict[str, Any]]:
    prefixes = tuple(f"{r}:" for r in run_ids)
    return [
        e for e in sandbox_requests(url) if (e.get("idempotency_key") or "").startswith(prefixes)
    ]


def sandbox_call(method: str, url: str, body: Any = None) -> Any:
    answer = httpx.request(method, url, json=body)
    answer.raise_for_status()
    return answer.json()


def oauth_config(url: str, **settings: float) -> None:
    httpx.post(f"{url}/_sandbox/oauth/config", json=settings).raise_for_status()


def oauth_stats(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/_sandbox/oauth/stats").json()


async def waiting_on_connection(api: Api, run_ids: list[str]) -> list[run_pb2.Run] | None:
    got = [await api.get(r) for r in run_ids]
    return got if all(r.status == run_pb2.RUN_STATUS_WAITING for r in got) else None


async def test_runs_post_as_the_connected_account(
    stack, db_url, executor_factory, sandbox_providers
) -> None:
    cp, api = stack
    account = f"ada-{uuid.uuid4().hex[:6]}@acme"
    cid = await connect(cp, db_url, account)
    await publish_poster(api, "poster-a", cid)
    run_ids = [await api.start("poster-a", f"go {i}") for i in range(3)]
    executor_factory(cp)
    runs = await api.wait_terminal(run_ids, within=60)
    assert [r.status for r in runs] == [run_pb2.RUN_STATUS_COMPLETED] * 3, [r.error for r in runs]
    sent = mine(sandbox_providers.url, run_ids)
    assert len(sent) == 3 and {e["account"] for e in sent} == {account}
    assert all(e["status"] == 200 and e["token_id"] for e in sent)
    for run_id in run_ids:
        assert "Bearer" not in str([s.payload for s in await api.steps(run_id)])


async def test_a_revoked_connection_parks_runs_unsent_and_reconnecting_wakes_them(
    stack, db_url, executor_factory, sandbox_providers
) -> None:
    cp, api = stack
    account = f"bob-{uuid.uuid4().hex[:6]}@acme"
    cid = await connect(cp, db_url, account)
    await publish_poster(api, "poster-b", cid)
    stub = connection_pb2_grpc.ConnectionServiceStub(api.channel)
    await stub.RevokeConnection(
        connection_pb2.RevokeConnectionRequest(workspace_id=WS, connection_id=cid)
    )
    run_ids = [await api.start("poster-b", f"go {i}") for i in range(3)]
    executor_factory(cp)
    await eventually(
        lambda: waiting_on_connection(api, run_ids),
        timeout=60,
        interval=0.2,
        message="runs did not park on the connection",
    )
    assert mine(sandbox_providers.url, run_ids) == []  # nothing was sent
    conn = await asyncpg.connect(db_url)
    try:
        rows = await conn.fetch(
            "SELECT wait_reason, wake_at, waiting_connection_id FROM runs WHERE run_id = ANY($1)",
            [uuid.UUID(r) for r in run_ids],
        )
        assert {
            (r["wait_reason"], r["wake_at"], str(r["waiting_connection_id"])) for r in rows
        } == {("connection", None, cid)}
        notes = await conn.fetch("SELECT payload FROM outbox WHERE kind = 'connection_reauth'")
        assert len(notes) == 1 and cid in notes[0]["payload"]
    finally:
        await conn.close()
    assert await connect(cp, db_url, account, connection_id=cid) == cid
    runs = await api.wait_terminal(run_ids, within=60)
    assert [r.status for r in runs] == [run_pb2.RUN_STATUS_COMPLETED] * 3, [r.error for r in runs]
    sent = mine(sandbox_providers.url, run_ids)
    assert len(sent) == 3 and {e["account"] for e in sent} == {account}


async def test_a_connection_without_the_tools_scope_parks_before_sending(
    stack, db_url, executor_factory, sandbox_providers
) -> None:
    cp, api = stack
    account = f"cy-{uuid.uuid4().hex[:6]}@acme"
    cid = await connect(cp, db_url, account, scope="chat:read")
    await publish_poster(api, "poster-c", cid)
    run_id = await api.start("poster-c", "go")
    executor_factory(cp)
    await eventually(
        lambda: waiting_on_connection(api, [run_id]),
        timeout=60,
        interval=0.2,
        message="the run did not park on the connection",
    )
    assert mine(sandbox_providers.url, [run_id]) == []
    park = (await api.steps(run_id))[-1]
    assert park.kind == "park" and "chat:write" in park.payload["note"]


async def test_the_cli_lists_shows_links_and_revokes_connections(stack, db_url) -> None:
    cp, _ = stack
    account = f"dee-{uuid.uuid4().hex[:6]}@acme"
    cid = await connect(cp, db_url, account)
    env = {**os.environ, "AGENTRUN_API_KEY": await workspace_key(db_url, WS, role="admin")}

    async def cli(*args: str) -> str:
        argv = [
            sys.executable,
            "-m",
            "agentrun_cli",
            "--address",
            cp.address,
            "--workspace",
            WS,
            "connections",
            *args,
        ]
        done = await asyncio.to_thread(
            subprocess.run, argv, capture_output=True, text=True, timeout=60, env=env
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert account in await cli("list") and "active" in await cli("show", cid)
    assert f"connection_id={cid}" in await cli("link", cid)
    assert "revoked" in await cli("revoke", cid)


@pytest.mark.parametrize("dropped", [False, True], ids=["answered", "answer-dropped-once"])
async def test_a_hundred_runs_on_an_expired_token_cause_one_refresh(
    stack, db_url, executor_factory, sandbox_providers, dropped
) -> None:
    """Dropped: the refresh's answer is lost once (the crash-mid-refresh case); the provider
    has a reuse interval, so the one retry gets the same rotation: two token-endpoint calls."""
    cp, api = stack
    url = sandbox_providers.url
    account = f"hal-{uuid.uuid4().hex[:6]}@acme"
    oauth_config(url, access_ttl_seconds=1)
    try:
        cid = await connect(cp, db_url, account)  # its access token is due at once
    finally:
        oauth_config(url, access_ttl_seconds=3600)
    await publish_poster(api, "poster-h", cid)
    run_ids = [await api.start("poster-h", f"go {i}") for i in range(100)]
    before = oauth_stats(url)
    if dropped:
        oauth_config(url, reuse_grace_seconds=30)
        sandbox_call("POST", f"{url}/_sandbox/oauth/drop_refresh", {"times": 1})
    try:
        executor_factory(cp, AGENTRUN_CAPACITY="100")
        runs = await api.wait_terminal(run_ids, within=180)
    finally:
        oauth_config(url, reuse_grace_seconds=0)
    assert {r.status for r in runs} == {run_pb2.RUN_STATUS_COMPLETED}
    after = oauth_stats(url)
    assert after["token_calls"] - before["token_calls"] == (2 if dropped else 1)
    assert after["reuse_revocations"] == before["reuse_revocations"]
    sent = mine(url, run_ids)
    assert len(sent) == 100 and {e["status"] for e in sent} == {200}
    (token_id,) = {e["token_id"] for e in sent}  # all carried the one new token
    assert token_id.endswith("/2")


async def test_a_grant_revoked_at_the_provider_parks_runs_and_asks_the_owner_once(
    stack, db_url, executor_factory, sandbox_providers
) -> None:
    cp, api = stack
    url = sandbox_providers.url
    account = f"ivy-{uuid.uuid4().hex[:6]}@acme"
    cid = await connect(cp, db_url, account)
    await publish_poster(api, "poster-i", cid)
    sandbox_call("POST", f"{url}/_sandbox/oauth/revoke", {"provider": "chat", "account": account})
    run_ids = [await api.start("poster-i", f"go {i}") for i in range(3)]
    executor_factory(cp)
    await eventually(
        lambda: waiting_on_connection(api, run_ids),
        timeout=60,
        interval=0.2,
        message="runs did not park on the connection",
    )
    # Each call was refused (401) before the provider acted: no post exists.
    assert {e["status"] for e in mine(url, run_ids)} == {401}
    effects = sandbox_call("GET", f"{url}/_sandbox/effects?provider=chat")["effects"]
    assert not [e for e in effects if (e["key"] or "").split(":")[0] in run_ids]
    conn = await asyncpg.connect(db_url)
    try:
        status = await conn.fetchval(
            "SELECT status FROM connections WHERE connection_id = $1", uuid.UUID(cid)
        )
        notes = await conn.fetchval(
            "SELECT count(*) FROM outbox WHERE kind = 'connection_reauth' AND payload->>'connection_id' = $1",
            cid,
        )
    finally:
        await conn.close()
    assert status == "needs_reauth" and notes == 1
    assert await connect(cp, db_url, account, connection_id=cid) == cid
    runs = await api.wait_terminal(run_ids, within=60)
    assert [r.status for r in runs] == [run_pb2.RUN_STATUS_COMPLETED] * 3, [r.error for r in runs]
