"""Remote MCP servers (issue 18): the sandbox MCP server (real HTTP, the `mcp` SDK's
streamable HTTP transport), the executor's call with its failure classes, and the control
plane's tools/list snapshot, diff and class confirmation.
"""

from __future__ import annotations

import json
import uuid

import grpc
import httpx
import pytest

from agentrun.v1 import agent_pb2, run_pb2, tool_pb2, tool_pb2_grpc
from control_plane.ground.config import ServerConfig
from control_plane.ground.errors import InvalidArgument
from control_plane.server import start as start_server
from control_plane.tools import mcp_sync
from executor.horizon import SEND_GATE, Refused
from executor.tools import definitions, mcp_call
from executor.tools.credentials import ConnectionUnusable, Credential, Granted
from executor.tools.mcp_call import call_mcp
from executor.tools.send_errors import MaybeSent, NotSent, ProviderError
from sandbox.mcp_server import McpSandbox, create_app
from sandbox.serve import BackgroundServer
from tests.harness import auth, secrets_seen
from tests.harness.agentrun_api import Api, set_fault
from tests.harness.connections import follow_start_link
from tests.harness.waiting import eventually

TOKEN = "sandbox-mcp-token-0123456789"
CODE = grpc.StatusCode
KEYED = tool_pb2.WriteClass(idempotency=mcp_sync.PROVIDER_KEY, idempotency_header="idempotency_key")
NO_KEY = tool_pb2.WriteClass(idempotency=mcp_sync.NONE)


@pytest.fixture(scope="module")
def desk():
    """One MCP sandbox for the module, served from a thread (real HTTP)."""
    app = create_app()
    with BackgroundServer(app) as served:
        yield served, app


@pytest.fixture
def mcp(desk) -> tuple[str, McpSandbox]:
    served, app = desk
    httpx.delete(f"{served.url}/_sandbox/requests").raise_for_status()
    httpx.delete(f"{served.url}/_sandbox/faults").raise_for_status()
    return served.url, app


def effects(url: str, tool: str) -> list[dict]:
    return httpx.get(f"{url}/_sandbox/effects", params={"tool": tool}).json()["effects"]


async def test_a_call_reads_writes_and_says_how_it_failed(mcp):
    url, app = mcp
    endpoint = f"{url}/mcp"
    created = await call_mcp(endpoint, "create_ticket", {"title": "Printer"}, timeout=10)
    assert created["ticket"]["title"] == "Printer"
    listed = await call_mcp(endpoint, "list_tickets", {"status": "open"}, timeout=10)
    assert [t["id"] for t in listed["tickets"]] == [created["ticket"]["id"]]

    with pytest.raises(ProviderError) as refused:  # the tool ran and said no (isError)
        await call_mcp(
            endpoint,
            "add_note",
            {"ticket_id": "T-404", "text": "x", "idempotency_key": "k0"},
            timeout=10,
        )
    assert refused.value.status == 422 and "no ticket 'T-404'" in refused.value.message
    with pytest.raises(NotSent):  # nothing listens: nothing can have happened
        await call_mcp("http://127.0.0.1:9/mcp", "create_ticket", {"title": "x"}, timeout=5)

    set_fault(url, tool="create_ticket", mode="error", status=503, count=1)
    with pytest.raises(ProviderError) as failed:
        await call_mcp(endpoint, "create_ticket", {"title": "Lost?"}, timeout=10)
    assert failed.value.status == 503 and failed.value.retryable
    assert len(effects(url, "create_ticket")) == 1, "an error fault acts before any effect"

    set_fault(url, tool="create_ticket", mode="drop_response", delay_ms=0, count=1)
    with pytest.raises(MaybeSent):  # the ticket was opened, the answer lost
        await call_mcp(endpoint, "create_ticket", {"title": "Dropped"}, timeout=10)
    assert [e["ticket_id"] for e in effects(url, "create_ticket")] == ["T-1", "T-2"]
    calls = [r for r in app.log.entries() if r["rpc"] == "tools/call"]
    assert [(r["tool"], r["fault"]) for r in calls][-2:] == [
        ("create_ticket", "error"),
        ("create_ticket", "drop_response"),
    ]


async def test_a_keyed_write_resent_under_its_key_lands_once(mcp):
    url, _ = mcp
    endpoint = f"{url}/mcp"
    ticket = (await call_mcp(endpoint, "create_ticket", {"title": "Keyed"}, timeout=10))["ticket"]
    note = {"ticket_id": ticket["id"], "text": "called back", "idempotency_key": "run-1:7"}
    set_fault(url, tool="add_note", mode="drop_response", delay_ms=0, count=1)
    with pytest.raises(MaybeSent):
        await call_mcp(endpoint, "add_note", note, timeout=10)
    again = await call_mcp(endpoint, "add_note", note, timeout=10)
    assert again["replayed"] is True and again["note"]["key"] == "run-1:7"
    assert [e["key"] for e in effects(url, "add_note")] == ["run-1:7"]


async def test_a_run_past_its_send_horizon_calls_nothing_on_the_mcp_server(mcp):
    """The run's last-moment check (executor/horizon.py) holds for MCP tools as for HTTP
    ones: refused after the session's set-up, before tools/call, and nothing happened."""
    url, app = mcp
    token = SEND_GATE.set(lambda: "no recent liveness acknowledgement from the control plane")
    try:
        # Held back on our side: Refused, never a send error that would become its result.
        with pytest.raises(Refused, match="no recent liveness"):
            await call_mcp(f"{url}/mcp", "create_ticket", {"title": "Late"}, timeout=10)
    finally:
        SEND_GATE.reset(token)
    assert [r for r in app.log.entries() if r["rpc"] == "tools/call"] == []
    assert effects(url, "create_ticket") == []


def credential(token: str) -> Credential:
    """A connection's credential as a run holds one (its token from GetConnectionToken)."""

    async def fetch(connection_id: str) -> Granted:
        return Granted(scopes=(), access_token=token)

    return Credential("conn-1", fetch)


async def test_a_token_server_refuses_a_call_without_it_and_never_logs_it():
    app = create_app(token=TOKEN)
    with BackgroundServer(app) as served:
        endpoint = f"{served.url}/mcp"
        with pytest.raises(ProviderError) as refused:
            await call_mcp(endpoint, "list_tickets", {}, timeout=10)
        assert refused.value.status == 401
        # A header with bytes past ASCII is a wrong token too, not a server error.
        async with httpx.AsyncClient() as client:
            odd = await client.post(
                endpoint, json={}, headers={"Authorization": b"Bearer t\xc3\xa9"}
            )
        assert odd.status_code == 401, odd.text
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert await call_mcp(endpoint, "list_tickets", {}, headers=bearer, timeout=10) == {
            "tickets": []
        }
        # As the executor calls a synced keyed write: the key in its argument, the token on
        # the wire; a token the server refuses parks the run on its connection.
        proposed = await mcp_sync.snapshot(endpoint, bearer, server_id="desk", connection="desk")
        ready = mcp_sync.confirm(mcp_sync.diff([], proposed), [], {"add_note": KEYED}).ready
        note = definitions.from_proto(next(t for t in ready if t.name == "desk__add_note"))
        app.desk.create_ticket("Keyed")
        made = await mcp_call.call(
            note, {"ticket_id": "T-1", "text": "hi"}, "run-9:3", credential(TOKEN)
        )
        assert made["note"]["key"] == "run-9:3"
        with pytest.raises(ConnectionUnusable, match="conn-1 was refused by the MCP server"):
            await mcp_call.call(
                note, {"ticket_id": "T-1", "text": "hi"}, "run-9:4", credential("revoked-token")
            )
        log = app.log.entries()
    assert log[0]["status"] == 401 and log[0]["authorized"] is False
    assert [e["key"] for e in app.desk.effects if e["tool"] == "add_note"] == ["run-9:3"]
    assert TOKEN not in json.dumps(log)


async def test_a_snapshot_proposes_reads_and_hinted_writes_and_saves_no_unconfirmed_write():
    app = create_app()  # its own: this test changes the server's tools
    with BackgroundServer(app) as served:
        await _snapshot_diff_confirm(served.url, app)


async def _snapshot_diff_confirm(url: str, app: McpSandbox) -> None:
    proposed = await mcp_sync.snapshot(f"{url}/mcp", None, server_id="desk", connection="desk")
    by_name = {t.name: t for t in proposed}
    assert sorted(by_name) == ["desk__add_note", "desk__create_ticket", "desk__list_tickets"]
    read, opened, noted = (
        by_name[f"desk__{n}"] for n in ("list_tickets", "create_ticket", "add_note")
    )
    assert read.access == tool_pb2.TOOL_ACCESS_READ and not read.idempotency
    assert (read.mcp.server_id, read.mcp.tool, read.mcp.url) == (
        "desk",
        "list_tickets",
        f"{url}/mcp",
    )
    assert read.source == "mcp" and read.connection == "desk"
    assert "status" in json.loads(read.parameters_json)["properties"]
    assert opened.idempotency == mcp_sync.NONE and noted.idempotency == mcp_sync.PROVIDER_KEY

    changes = mcp_sync.diff([], proposed)
    assert {c.name: c.kind for c in changes} == dict.fromkeys(by_name, mcp_sync.ADDED)
    assert {c.name: c.proposed_class for c in changes if c.needs_class} == {
        "desk__create_ticket": mcp_sync.NONE,
        "desk__add_note": mcp_sync.PROVIDER_KEY,
    }
    keyed = tool_pb2.WriteClass(
        idempotency=mcp_sync.PROVIDER_KEY, idempotency_header="idempotency_key"
    )
    first = mcp_sync.confirm(changes, [], {"add_note": keyed})
    assert sorted(t.name for t in first.ready) == ["desk__add_note", "desk__list_tickets"]
    assert [c.name for c in first.pending] == ["desk__create_ticket"]
    saved_note = next(t for t in first.ready if t.name == "desk__add_note")
    assert saved_note.mcp.key_argument == "idempotency_key"
    assert "idempotency_key" not in json.loads(saved_note.parameters_json)["properties"]
    assert "idempotency_key" not in json.loads(saved_note.parameters_json)["required"]

    with pytest.raises(InvalidArgument, match=r"classes\[create_ticket\].idempotency_header"):
        mcp_sync.confirm(
            changes,
            [],
            {
                "create_ticket": tool_pb2.WriteClass(
                    idempotency=mcp_sync.PROVIDER_KEY, idempotency_header="nope"
                )
            },
        )
    with pytest.raises(InvalidArgument, match=r"classes\[list_tickets\]"):
        mcp_sync.confirm(changes, [], {"list_tickets": keyed})

    # Saved as is, nothing differs; the server changes one tool and drops another.
    assert mcp_sync.diff(first.ready, [read, noted]) == []
    app.mcp.remove_tool("list_tickets")

    @app.mcp.tool(description="List tickets (now paged).")
    def list_tickets(page: int = 0) -> dict:
        return app.desk.list_tickets()

    again = await mcp_sync.snapshot(f"{url}/mcp", {}, server_id="desk", connection="desk")
    changes = mcp_sync.diff(first.ready, [t for t in again if t.name != "desk__add_note"])
    assert sorted((c.name, c.kind, list(c.fields)) for c in changes) == [
        ("desk__add_note", mcp_sync.REMOVED, []),
        ("desk__create_ticket", mcp_sync.ADDED, []),
        (
            "desk__list_tickets",
            mcp_sync.CHANGED,
            ["description", "parameters", "access", "annotations"],
        ),
    ]


async def test_an_unreachable_server_is_named_without_its_credentials():
    with pytest.raises(mcp_sync.McpUnreachable, match="could not be asked") as failed:
        await mcp_sync.snapshot(
            "http://127.0.0.1:9/mcp",
            {"Authorization": f"Bearer {TOKEN}"},
            server_id="gone",
            timeout=5,
        )
    assert TOKEN not in str(failed.value)


# McpServerService (in-process control plane, real Postgres, the sandbox MCP server).


async def stubs(server, db_url: str, ws: str):
    key = await auth.workspace_key(db_url, ws, role="admin")
    channel = auth.channel(f"127.0.0.1:{server.port}", key)
    return (
        channel,
        tool_pb2_grpc.McpServerServiceStub(channel),
        tool_pb2_grpc.ToolServiceStub(channel),
    )


async def test_a_server_is_added_and_synced_and_no_write_is_saved_unconfirmed(
    mcp, server, db_url, db
):
    url, _ = mcp
    channel, servers, tools = await stubs(server, db_url, "acme")
    async with channel:
        added = await servers.AddMcpServer(
            tool_pb2.AddMcpServerRequest(
                server_id="desk", url=f"{url}/mcp", classes={"add_note": KEYED}
            )
        )
        assert sorted(t.name for t in added.tools) == ["desk__add_note", "desk__list_tickets"]
        assert [(p.name, p.needs_class, p.proposed_class) for p in added.pending] == [
            ("desk__create_ticket", True, mcp_sync.NONE)
        ]
        assert list(added.server.tools) == ["desk__add_note", "desk__list_tickets"]
        note = (await tools.GetTool(tool_pb2.GetToolRequest(name="desk__add_note"))).tool
        assert (note.source, note.idempotency, note.mcp.key_argument) == (
            "mcp",
            mcp_sync.PROVIDER_KEY,
            "idempotency_key",
        )
        assert note.created_by.startswith("key:") and note.workspace_id == "acme"

        looked = await servers.SyncMcpServer(tool_pb2.SyncMcpServerRequest(server_id="desk"))
        assert [(c.kind, c.name, c.needs_class) for c in looked.changes] == [
            (mcp_sync.ADDED, "desk__create_ticket", True)
        ]
        assert not looked.tools
        applied = await servers.SyncMcpServer(
            tool_pb2.SyncMcpServerRequest(
                server_id="desk", apply=True, classes={"create_ticket": NO_KEY}
            )
        )
        assert [t.name for t in applied.tools] == ["desk__create_ticket"]
        assert not applied.changes[0].needs_class
        settled = await servers.SyncMcpServer(tool_pb2.SyncMcpServerRequest(server_id="desk"))
        assert list(settled.changes) == []

        (listed,) = (await servers.ListMcpServers(tool_pb2.ListMcpServersRequest())).servers
        assert listed.server_id == "desk" and len(listed.tools) == 3
        assert listed.last_sync_time.seconds >= listed.create_time.seconds > 0
    count = "SELECT count(*) FROM tools WHERE workspace_id = 'acme' AND source = 'mcp'"
    assert await db.fetchval(count) == 3


REFUSALS = [
    ({"server_id": "Desk!", "url": "{url}"}, CODE.INVALID_ARGUMENT, "server_id"),
    ({"server_id": "desk", "url": "ftp://x/mcp"}, CODE.INVALID_ARGUMENT, "url"),
    ({"server_id": "desk", "url": "mcp.example/mcp"}, CODE.INVALID_ARGUMENT, "url"),
    (
        {"server_id": "desk", "url": "http://127.0.0.1:9/mcp"},
        CODE.FAILED_PRECONDITION,
        "could not be asked for its tools",
    ),
    (
        {"server_id": "desk", "url": "{url}", "connection": "tracker"},
        CODE.FAILED_PRECONDITION,
        "no active connection for provider 'tracker'",
    ),
    (
        {
            "server_id": "desk",
            "url": "{url}",
            "classes": {
                "create_ticket": tool_pb2.WriteClass(idempotency=tool_pb2.IDEMPOTENCY_CLASS_LOOKUP)
            },
        },
        CODE.INVALID_ARGUMENT,
        "classes[create_ticket].idempotency",
    ),
    (
        {"server_id": "desk", "url": "{url}", "classes": {"nope": NO_KEY}},
        CODE.INVALID_ARGUMENT,
        "classes[nope]",
    ),
]


async def test_a_refused_add_names_why_and_writes_nothing(mcp, server, db_url, db):
    url, _ = mcp
    channel, servers, _ = await stubs(server, db_url, "acme")
    async with channel:
        for request_fields, code, names in REFUSALS:
            fields = {
                k: v.replace("{url}", f"{url}/mcp") if k == "url" else v
                for k, v in request_fields.items()
            }
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await servers.AddMcpServer(tool_pb2.AddMcpServerRequest(**fields))
            assert (refused.value.code(), names in refused.value.details()) == (code, True), (
                fields,
                refused.value.details(),
            )
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await servers.SyncMcpServer(tool_pb2.SyncMcpServerRequest(server_id="desk"))
        assert missing.value.code() == CODE.NOT_FOUND
    assert await db.fetchval("SELECT count(*) FROM mcp_servers") == 0
    assert await db.fetchval("SELECT count(*) FROM tools WHERE source = 'mcp'") == 0


# Must show (issue 18): a synced MCP server's tools called by runs (control plane and executor
# processes, Postgres, the model sandbox and the MCP sandbox over real HTTP).


async def test_runs_call_synced_mcp_tools_and_a_lost_answer_is_settled_by_its_class(
    mcp, db_url, executor_factory, sandbox_providers
):
    """...and a third run reads a server that honours only the workspace's chat token: the
    executor calls it with the connection's token, which is in no step, answer or log."""
    url, app = mcp
    server = await start_server(
        ServerConfig(database_url=db_url, listen="127.0.0.1:0", oauth_url=sandbox_providers.url)
    )
    address = f"127.0.0.1:{server.port}"
    api = await Api.connect(address, db_url)
    vault = Vault(api, server.http_port, sandbox_providers.url)
    try:
        await vault.open()
        await tool_pb2_grpc.McpServerServiceStub(api.channel).AddMcpServer(
            tool_pb2.AddMcpServerRequest(
                workspace_id=api.ws,
                server_id="desk",
                url=f"{url}/mcp",
                classes={"add_note": KEYED, "create_ticket": NO_KEY},
            )
        )
        await api.publish("desk", "mcp_desk", ["desk__list_tickets", "desk__create_ticket"])
        await api.publish("noter", "mcp_note", ["desk__add_note"])
        ticket = (await call_mcp(f"{url}/mcp", "create_ticket", {"title": "Known"}))["ticket"]
        opened = await api.start("desk")
        noted = await api.start("noter", ticket["id"])
        # Both answers are lost after the effect: the ticket opened, the note added.
        set_fault(url, tool="create_ticket", mode="drop_response", delay_ms=0, count=1)
        set_fault(
            url, tool="add_note", mode="drop_response", delay_ms=0, count=1, key_prefix=f"{noted}:"
        )
        executor = executor_factory(address, AGENTRUN_EXECUTOR_KEY=await auth.executor_key(db_url))

        # class none: nothing may settle it but a person; it is never sent again.
        unknown = await eventually(
            lambda: api.awaiting_person(opened),
            timeout=90,
            message="the lost create never waited for a person",
        )
        assert (unknown.payload["status"], unknown.payload["tool"]) == (
            "unknown",
            "desk__create_ticket",
        )
        read = next(s for s in await api.steps(opened) if s.kind == "tool_result")
        assert (read.payload["tool"], read.payload["status"]) == ("desk__list_tickets", "ok")
        assert len(effects(url, "create_ticket")) == 2  # the test's own, and the lost one
        await api.resolve_unknown(opened, unknown.seq, "happened", "key:tester", "saw it")

        # class provider_key: resent under the same key, the note lands once.
        done, run = await api.wait_terminal([opened, noted], within=60)
        assert done.status == run_pb2.RUN_STATUS_COMPLETED, done.error
        assert len(effects(url, "create_ticket")) == 2, "a person's 'happened' sends nothing"
        assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
        started = [s for s in await api.steps(noted) if s.kind == "tool_started"]
        key = started[0].payload["idempotency_key"]
        assert len(started) == 1 and key.startswith(f"{noted}:")
        calls = [r for r in app.log.entries() if r["tool"] == "add_note"]
        assert [(r["key"], r["fault"]) for r in calls] == [(key, "drop_response"), (key, None)]
        assert [e["key"] for e in effects(url, "add_note")] == [key]
        assert '"replayed": true' in run.output  # the model read the server's own answer
        await vault.check(executor[0].log_path.read_text(errors="replace"))
    finally:
        vault.close()
        await api.close()
        await server.stop(grace=0)


class Vault:
    """An MCP server (the sandbox) that honours only the workspace's chat token, added with
    connection "chat", and a run of an agent that reads it."""

    def __init__(self, api: Api, http_port: int, providers_url: str) -> None:
        self.api, self.http_port, self.providers_url = api, http_port, providers_url
        self.served: BackgroundServer | None = None

    async def open(self) -> None:
        owner = await auth.workspace_key(
            self.api.db_url, self.api.ws, role="operator", principal="owner"
        )
        account = f"vault-{uuid.uuid4().hex[:6]}@example"
        linked = await follow_start_link(
            f"http://127.0.0.1:{self.http_port}", self.api.ws, owner, account
        )
        self.tokens = [secrets_seen.remember(t) for t in tokens_of(self.providers_url, account)]
        self.app = create_app(token=self.tokens[-1])
        self.served = BackgroundServer(self.app).start()
        self.added = await tool_pb2_grpc.McpServerServiceStub(self.api.channel).AddMcpServer(
            tool_pb2.AddMcpServerRequest(
                workspace_id=self.api.ws,
                server_id="vault",
                url=f"{self.served.url}/mcp",
                connection="chat",
            )
        )
        await self.api.agents.CreateAgent(
            agent_pb2.CreateAgentRequest(workspace_id=self.api.ws, agent_id="vaulted")
        )
        spec = agent_pb2.AgentSpec(
            model="mcp_vault",
            instructions="read",
            tools=["vault__list_tickets"],
            connections={"chat": str(linked["connection_id"])},
        )
        await self.api.agents.PublishAgentVersion(
            agent_pb2.PublishAgentVersionRequest(
                workspace_id=self.api.ws, agent_id="vaulted", spec=spec
            )
        )
        self.run_id = await self.api.start("vaulted")

    async def check(self, executor_log: str) -> None:
        (done,) = await self.api.wait_terminal([self.run_id], within=60)
        assert done.status == run_pb2.RUN_STATUS_COMPLETED, done.error
        calls = [e for e in self.app.log.entries() if e.get("tool") == "list_tickets"]
        assert [e["status"] for e in calls] == [200], "called once, with the account's token"
        steps = json.dumps([s.payload for s in await self.api.steps(self.run_id)])
        shown = [steps, str(done), str(self.added), executor_log]
        assert not [t for t in self.tokens if any(t in text for text in shown)]

    def close(self) -> None:
        if self.served is not None:
            self.served.stop()


def tokens_of(providers_url: str, account: str) -> list[str]:
    """The access tokens the provider sandbox issued to `account` (a test control)."""
    answer = httpx.get(f"{providers_url}/_sandbox/oauth/tokens", params={"account": account})
    return list(answer.json()["tokens"])


async def test_a_server_behind_a_connection_is_asked_with_its_token_and_never_shows_it(
    db_url, sandbox_providers
):
    """The control plane asks with the workspace's connection's token (from the connections
    store, refreshed as needed); the token is in no answer and no saved definition."""
    config = ServerConfig(
        database_url=db_url, listen="127.0.0.1:0", oauth_url=sandbox_providers.url
    )
    cp = await start_server(config)
    try:
        owner = await auth.workspace_key(db_url, "acme", role="operator", principal="owner")
        account = f"desk-{uuid.uuid4().hex[:6]}@example"
        await follow_start_link(f"http://127.0.0.1:{cp.http_port}", "acme", owner, account)
        tokens = tokens_of(sandbox_providers.url, account)
        app = create_app(token=tokens[-1])  # the server honours that account's token only
        with BackgroundServer(app) as served:
            channel, servers, tools = await stubs(cp, db_url, "acme")
            async with channel:
                added = await servers.AddMcpServer(
                    tool_pb2.AddMcpServerRequest(
                        server_id="desk", url=f"{served.url}/mcp", connection="chat"
                    )
                )
                listed = await tools.ListTools(tool_pb2.ListToolsRequest())
        assert [t.name for t in added.tools] == ["desk__list_tickets"]
        assert all(t.connection == "chat" for t in added.tools)
        assert [r["status"] for r in app.log.entries()] == [200, 200]  # discover, tools/list
        shown = added.SerializeToString() + listed.SerializeToString()
        assert not any(token.encode() in shown for token in tokens)
    finally:
        await cp.stop(grace=0)
