"""Registry tools in runs, with real processes: a control plane, an executor, the provider
sandbox (its OAuth server and chat provider), the model sandbox and Postgres.

Two workspaces each add an HTTP tool named `channel_history` (a templated path, a bearer
token from their own chat connection) and run an agent calling it. Each run calls its own
workspace's definition as its own account; the token appears only on the wire (steps,
responses and both processes' logs hold none); and a tool version saved after a publish does
not change that agent version's runs. Acme's agent then charges through a keyed registry
write whose first response is dropped: resent under the same key, it lands once.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest

from agentrun.v1 import agent_pb2, run_pb2, tool_pb2, tool_pb2_grpc
from tests.harness import secrets_seen
from tests.harness.agentrun_api import Api, sandbox_requests
from tests.harness.auth import workspace_key
from tests.harness.connections import follow_start_link

SCHEMA = {
    "type": "object",
    "properties": {"channel": {"type": "string"}, "limit": {"type": "integer"}},
    "required": ["channel"],
    "additionalProperties": False,
}


def history_tool(sandbox_url: str, pointer: str) -> tool_pb2.Tool:
    return tool_pb2.Tool(
        name="channel_history",
        description="The latest posts of a chat channel.",
        parameters_json=json.dumps(SCHEMA),
        access=tool_pb2.TOOL_ACCESS_READ,
        connection="chat",
        capabilities=["reads_private"],
        http=tool_pb2.HttpTemplate(
            method="GET",
            url=sandbox_url + "/chat/channels/{channel}/messages",
            query={"limit": "{limit}"},
            auth="bearer",
            response_pointer=pointer,
        ),
    )


def charge_tool(sandbox_url: str) -> tool_pb2.Tool:
    """A keyed write (the payments sandbox dedupes on Idempotency-Key)."""
    schema = {
        "type": "object",
        "required": ["amount", "currency", "customer"],
        "properties": {
            "amount": {"type": "integer"},
            "currency": {"type": "string"},
            "customer": {"type": "string"},
        },
    }
    return tool_pb2.Tool(
        name="charge_customer",
        description="Charge a customer.",
        parameters_json=json.dumps(schema),
        access=tool_pb2.TOOL_ACCESS_WRITE,
        idempotency=tool_pb2.IDEMPOTENCY_CLASS_PROVIDER_KEY,
        key_retention_hours=24,
        http=tool_pb2.HttpTemplate(
            method="POST",
            url=sandbox_url + "/payments/charges",
            body="arguments",
            timeout_seconds=5,
        ),
    )


async def workspace(cp, db_url: str, ws: str, sandbox_url: str, pointer: str, *extra):
    """A workspace with its own chat account, tools and published agent."""
    account = f"{ws}-{uuid.uuid4().hex[:6]}@example"
    owner = await workspace_key(db_url, ws, role="operator", principal="owner")
    cid = str((await follow_start_link(cp.http_url, ws, owner, account))["connection_id"])
    api = await Api.connect(cp.address, db_url, ws)
    tools = tool_pb2_grpc.ToolServiceStub(api.channel)
    saved = await tools.CreateTool(
        tool_pb2.CreateToolRequest(tool=history_tool(sandbox_url, pointer))
    )
    for tool in extra:
        await tools.CreateTool(tool_pb2.CreateToolRequest(tool=tool))
    await api.agents.CreateAgent(agent_pb2.CreateAgentRequest(agent_id="reader"))
    spec = agent_pb2.AgentSpec(
        model="history_charger" if extra else "history_reader",
        instructions="read",
        tools=["channel_history", *(t.name for t in extra)],
        connections={"chat": cid},
    )
    published = await api.agents.PublishAgentVersion(
        agent_pb2.PublishAgentVersionRequest(agent_id="reader", spec=spec)
    )
    return api, tools, account, saved, published


def sandbox(method: str, url: str, **request) -> Any:
    answer = httpx.request(method, url, **request)
    answer.raise_for_status()
    return answer.json()


def post(sandbox_url: str, channel: str, text: str) -> None:
    sandbox("POST", f"{sandbox_url}/chat/messages", json={"channel": channel, "text": text})


def tokens_of(sandbox_url: str, account: str) -> list[str]:
    answer = httpx.get(f"{sandbox_url}/_sandbox/oauth/tokens", params={"account": account})
    return [secrets_seen.remember(t) for t in answer.json()["tokens"]]


@pytest.mark.timeout(120)
async def test_each_workspace_calls_its_own_tool_as_its_own_account_and_the_token_stays_on_the_wire(
    db_url, control_plane, executor_factory, sandbox_providers
):
    url = sandbox_providers.url
    cp = control_plane(db_url)
    text = f"standup at ten [{uuid.uuid4().hex[:8]}]"
    post(url, "#sales", text)
    acme, acme_tools, acme_account, saved, published = await workspace(
        cp, db_url, "acme", url, "/messages", charge_tool(url)
    )
    globex, _, globex_account, _, _ = await workspace(cp, db_url, "globex", url, "/channel")
    assert dict(published.version.tool_versions) == {"channel_history": 1, "charge_customer": 1}
    # A new version after the publish: the published version's runs still use version 1.
    newer = history_tool(url, "/ok")
    later = await acme_tools.CreateTool(tool_pb2.CreateToolRequest(tool=newer))
    assert later.tool.version == 2
    runs = {"acme": await acme.start("reader", "go"), "globex": await globex.start("reader", "go")}
    drop = {
        "provider": "payments",
        "mode": "drop_response",
        "path": "/payments/charges",
        "key_prefix": f"{runs['acme']}:",
        "count": 1,
        "delay_ms": 0,
    }
    sandbox("POST", f"{url}/_sandbox/faults", json=drop)
    executor = executor_factory(cp)[0]
    finished = {
        "acme": (await acme.wait_terminal([runs["acme"]], within=60))[0],
        "globex": (await globex.wait_terminal([runs["globex"]], within=60))[0],
    }
    assert all(r.status == run_pb2.RUN_STATUS_COMPLETED for r in finished.values()), finished

    # "#sales" went as one escaped path segment (unescaped, '#' would have cut the URL).
    sent = {
        e["idempotency_key"].split(":")[0]: e
        for e in sandbox_requests(url)
        if e["path"] == "/chat/channels/%23sales/messages" and e.get("idempotency_key")
    }
    assert sent[runs["acme"]]["account"] == acme_account  # each as its own connection
    assert sent[runs["globex"]]["account"] == globex_account
    assert sent[runs["acme"]]["query"] == {"limit": "5"} and sent[runs["acme"]]["status"] == 200
    results = {
        ws: [s for s in await api.steps(runs[ws]) if s.kind == "tool_result"][0].payload
        for ws, api in (("acme", acme), ("globex", globex))
    }
    # The keyed write: its response dropped, resent under the same key, charged once.
    charges = [
        e
        for e in sandbox_requests(url)
        if e["path"] == "/payments/charges" and e["idempotency_key"].startswith(f"{runs['acme']}:")
    ]
    assert [e["fault"] for e in charges] == ["drop_response", None]
    assert len({e["idempotency_key"] for e in charges}) == 1
    effects = sandbox("GET", f"{url}/_sandbox/effects", params={"provider": "payments"})
    assert [e["key"] for e in effects["effects"]].count(charges[0]["idempotency_key"]) == 1
    assert text in json.dumps(results["acme"]["output"])  # version 1's pointer: the messages
    assert results["globex"]["output"] == "#sales"  # globex's own definition

    # The token only ever travelled on the wire.
    tokens = tokens_of(url, acme_account) + tokens_of(url, globex_account)
    assert tokens
    seen = [
        json.dumps([s.payload for s in await acme.steps(runs["acme"])]),
        json.dumps([s.payload for s in await globex.steps(runs["globex"])]),
        str(finished),
        str(saved),
        str(later),
        str(published),
        str(await acme_tools.ListTools(tool_pb2.ListToolsRequest())),
        cp.process.log_path.read_text(errors="replace"),
        executor.log_path.read_text(errors="replace"),
    ]
    assert not [t for t in tokens if any(t in text for text in seen)]
    for api in (acme, globex):
        await api.close()
