"""What a workspace's tools may reach and for how long (issue 18, second round): the network
guard on registry tools' URLs (HTTP templates, MCP servers, the control plane's tools/list),
an MCP tool's own call deadline, and a sync that retires the tools its server dropped.

Real servers throughout: a recording HTTP server and the MCP sandbox served from a thread,
the in-process control plane on real Postgres.
"""

from __future__ import annotations

import asyncio
import ssl
import time

import grpc
import pytest
from mcp.types import ToolAnnotations
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentrun.v1 import tool_pb2, tool_pb2_grpc
from control_plane.tools import mcp_sync
from executor.config import ExecutorConfig
from executor.tools.definitions import from_proto
from executor.tools.delivery import ToolDelivery
from executor.tools.http_tool import HttpToolClient
from executor.tools.mcp_call import call_mcp
from executor.tools.send_errors import Blocked, MaybeSent, ProviderError
from ground import netguard
from sandbox.mcp_server import create_app
from sandbox.serve import BackgroundServer
from tests.harness import auth
from tests.harness.agentrun_api import Api, set_fault
from tests.harness.cli import agentrun_async
from tests.harness.tls import Pki

CODE = grpc.StatusCode
KEYED = tool_pb2.WriteClass(idempotency=mcp_sync.PROVIDER_KEY, idempotency_header="idempotency_key")
NO_KEY = tool_pb2.WriteClass(idempotency=mcp_sync.NONE)
READ = tool_pb2.TOOL_ACCESS_READ


def http_tool(url: str) -> tool_pb2.Tool:
    return tool_pb2.Tool(
        name="fetch",
        version=1,
        parameters_json='{"type": "object"}',
        access=READ,
        http=tool_pb2.HttpTemplate(method="GET", url=url),
    )


def mcp_tool(url: str, tool: str, timeout: float = 0.0) -> tool_pb2.Tool:
    return tool_pb2.Tool(
        name=f"desk__{tool}",
        version=1,
        parameters_json='{"type": "object"}',
        access=READ,
        mcp=tool_pb2.McpTarget(server_id="desk", tool=tool, url=url, timeout_seconds=timeout),
    )


def echo_app(hosts: list[str]) -> Starlette:
    async def echo(request: Request) -> JSONResponse:
        hosts.append(request.headers["host"])
        return JSONResponse({"ok": True})

    return Starlette(routes=[Route("/echo", echo)])


async def test_a_tool_reaches_a_named_host_but_never_a_refused_address(monkeypatch):
    """Resolved at call time, connected to the checked address, Host still the name; a
    refusal is a tool error naming the host only, sent once and not retried."""
    monkeypatch.delenv(netguard.ENV, raising=False)
    hosts: list[str] = []
    client, denying = HttpToolClient(ExecutorConfig()), HttpToolClient(ExecutorConfig())
    delivery = ToolDelivery(denying, initial_wait=0.01, max_wait=0.01)
    try:
        with BackgroundServer(echo_app(hosts)) as served:
            named = from_proto(http_tool(f"http://localhost:{served.port}/echo"))
            assert await client.send(named, {}, "k1") == {"ok": True}
            assert hosts == [f"localhost:{served.port}"]

            # Saved before (or around) the save-time check: refused when called.
            for url in (
                "http://169.254.169.254/latest/meta-data/",
                "http://[::ffff:169.254.169.254]/latest",
                f"http://0.0.0.0:{served.port}/echo",
            ):
                with pytest.raises(Blocked, match="not reachable for tools"):
                    await client.send(from_proto(http_tool(url)), {}, "k2")

            # The operator refuses private networks (a connection made before stays up:
            # an executor's policy is its start's, so a client of its own here).
            monkeypatch.setenv(netguard.ENV, "deny")
            outcome = await delivery.send(named, {}, "k3", guard=lambda: None)
        assert outcome.status == "error" and "after 1 attempt;" in (outcome.error or "")
        assert "'localhost'" in (outcome.error or "")
        assert not any(ip in (outcome.error or "") for ip in ("127.0.0.1", "::1"))
        assert hosts == [f"localhost:{served.port}"], "nothing refused reached the server"
    finally:
        await client.aclose()
        await denying.aclose()


async def test_through_the_guard_tls_verifies_the_name_and_sni_and_host_carry_it(
    tmp_path, monkeypatch
):
    """The connection goes to the checked address, but the certificate (issued to the name
    only, no IP) is verified for the name, and SNI and Host carry it."""
    monkeypatch.delenv(netguard.ENV, raising=False)
    pki = Pki.create(tmp_path)
    served = pki.server_cert("localhost")
    names: list[str | None] = []
    heads: list[bytes] = []
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(served.cert, served.key)
    context.sni_callback = lambda _sock, name, _ctx: names.append(name)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b'Content-Length: 12\r\nConnection: close\r\n\r\n{"ok": true}'
        )
        await writer.drain()
        writer.close()

    listener = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=context)
    port = listener.sockets[0].getsockname()[1]
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca))  # the client trusts the test CA
    client = HttpToolClient(ExecutorConfig())
    try:
        tool = from_proto(http_tool(f"https://localhost:{port}/echo"))
        assert await client.send(tool, {}, "k1") == {"ok": True}
    finally:
        await client.aclose()
        listener.close()
    assert names == ["localhost"]
    assert f"host: localhost:{port}".encode() in heads[0].lower()


async def test_an_mcp_call_keeps_its_tools_deadline_and_its_server_is_guarded(monkeypatch):
    monkeypatch.delenv(netguard.ENV, raising=False)
    app = create_app()
    client = HttpToolClient(ExecutorConfig(tool_timeout_seconds=30.0))
    try:
        with BackgroundServer(app) as served:
            patient = from_proto(mcp_tool(f"{served.url}/mcp", "list_tickets", timeout=10.0))
            assert await client.send(patient, {}, "k1") == {"tickets": []}
            hurried = from_proto(mcp_tool(f"{served.url}/mcp", "list_tickets", timeout=0.8))
            set_fault(served.url, tool="list_tickets", mode="delay", delay_ms=1500, count=1)
            started = time.monotonic()
            with pytest.raises(MaybeSent, match=r"within 0\.8s"):
                await client.send(hurried, {}, "k2")
            assert time.monotonic() - started < 1.4, "the tool's 0.8 s, not the platform's 30 s"

            with pytest.raises(Blocked, match="169.254.169.254"):  # the host as written
                await call_mcp("http://169.254.169.254/mcp", "list_tickets", {}, timeout=5)
            monkeypatch.setenv(netguard.ENV, "deny")
            local = f"http://localhost:{served.port}/mcp"
            with pytest.raises(Blocked, match="'localhost'"):
                await client.send(from_proto(mcp_tool(local, "list_tickets")), {}, "k3")
            with pytest.raises(mcp_sync.McpUnreachable, match="was not asked") as unasked:
                await mcp_sync.snapshot(local, None, server_id="desk")
            assert "127.0.0.1" not in str(unasked.value)
        calls = [e for e in app.log.entries() if e.get("tool") == "list_tickets"]
        assert len(calls) == 2, "no refused call reached the server"
    finally:
        await client.aclose()


async def test_a_sync_retires_a_dropped_tool_and_a_pinned_version_fails_clearly(
    server, db_url, db, monkeypatch
):
    monkeypatch.delenv(netguard.ENV, raising=False)
    app = create_app()  # its own: this test changes the server's tools
    api = await Api.connect(f"127.0.0.1:{server.port}", db_url)
    servers = tool_pb2_grpc.McpServerServiceStub(api.channel)
    tools = tool_pb2_grpc.ToolServiceStub(api.channel)
    client = HttpToolClient(ExecutorConfig())
    try:
        with BackgroundServer(app) as served:
            url = f"{served.url}/mcp"
            for fields, named in (
                ({"url": url, "timeout_seconds": 301.0}, "timeout_seconds"),
                ({"url": "http://169.254.169.254/mcp"}, "url"),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await servers.AddMcpServer(
                        tool_pb2.AddMcpServerRequest(
                            workspace_id=api.ws, server_id="desk", **fields
                        )
                    )
                assert refused.value.code() == CODE.INVALID_ARGUMENT
                assert named in refused.value.details()
            added = await servers.AddMcpServer(
                tool_pb2.AddMcpServerRequest(
                    workspace_id=api.ws,
                    server_id="desk",
                    url=url,
                    timeout_seconds=2.5,
                    classes={"add_note": KEYED, "create_ticket": NO_KEY},
                )
            )
            assert added.server.timeout_seconds == 2.5
            assert {t.mcp.timeout_seconds for t in added.tools} == {2.5} and len(added.tools) == 3
            await api.publish("desk", "mcp_desk", ["desk__list_tickets", "desk__create_ticket"])

            # The server drops a tool and now says its create is idempotent.
            app.mcp.remove_tool("list_tickets")
            app.mcp.remove_tool("create_ticket")
            app.mcp.tool(
                annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=True),
                description="Open a new ticket (every call opens another).",
                name="create_ticket",
            )(app.desk.create_ticket)
            shown = await agentrun_async(
                f"127.0.0.1:{server.port}",
                await auth.workspace_key(db_url, api.ws, role="admin"),
                "tools",
                "sync",
                "desk",
                workspace=api.ws,
            )
            assert shown.returncode == 0, shown.stderr
            await _diff_then_apply(servers, api.ws, db, shown.stdout)
            await _retired_is_not_offered(api, tools)

            # The agent version published before keeps its pin: its call fails as a tool
            # error, nothing called, while the server does not serve the tool.
            pinned = (
                await tools.GetTool(
                    tool_pb2.GetToolRequest(
                        workspace_id=api.ws, name="desk__list_tickets", version=1
                    )
                )
            ).tool
            with pytest.raises(ProviderError, match="no longer offers") as gone:
                await client.send(from_proto(pinned), {}, "k1")
            assert gone.value.status == 404 and not gone.value.retryable
        pins = await db.fetchval(
            "SELECT tool_versions FROM agent_versions WHERE workspace_id = $1 AND agent_id = "
            "'desk'",
            api.ws,
        )
        assert '"desk__list_tickets": {"version": 1' in pins
    finally:
        await client.aclose()
        await api.close()


async def _diff_then_apply(
    servers: tool_pb2_grpc.McpServerServiceStub, ws: str, db, shown: str
) -> None:
    """The diff (as `agentrun tools sync` showed it), a stale apply, then the shown one."""
    looked = await servers.SyncMcpServer(
        tool_pb2.SyncMcpServerRequest(workspace_id=ws, server_id="desk")
    )
    assert (
        "~ desk__create_ticket  annotations  write, proposed provider_key: needs --class" in shown
    )
    assert "- desk__list_tickets  no longer listed: applying retires it" in shown
    assert f"--apply --expect {looked.digest}" in shown
    assert [(c.kind, c.name, list(c.fields), c.needs_class) for c in looked.changes] == [
        (mcp_sync.CHANGED, "desk__create_ticket", ["annotations"], True),
        (mcp_sync.REMOVED, "desk__list_tickets", [], False),
    ], "a changed hint asks the person again; the dropped tool shows as removed"
    count = "SELECT count(*) FROM tools WHERE workspace_id = $1"
    before = await db.fetchval(count, ws)
    with pytest.raises(grpc.aio.AioRpcError) as stale:
        await servers.SyncMcpServer(
            tool_pb2.SyncMcpServerRequest(
                workspace_id=ws,
                server_id="desk",
                apply=True,
                expect_digest="0" * 16,
                classes={"create_ticket": NO_KEY},
            )
        )
    assert stale.value.code() == CODE.FAILED_PRECONDITION and "sync again" in stale.value.details()
    assert await db.fetchval(count, ws) == before, "a stale diff saves nothing"
    applied = await servers.SyncMcpServer(
        tool_pb2.SyncMcpServerRequest(
            workspace_id=ws,
            server_id="desk",
            apply=True,
            expect_digest=looked.digest,
            classes={"create_ticket": NO_KEY},
        )
    )
    assert applied.digest == looked.digest
    assert [(t.name, t.version, t.retired) for t in applied.tools] == [
        ("desk__create_ticket", 2, False),
        ("desk__list_tickets", 2, True),
    ]
    again = await servers.SyncMcpServer(
        tool_pb2.SyncMcpServerRequest(workspace_id=ws, server_id="desk")
    )
    assert list(again.changes) == [], "a retired tool is not reported again"


async def _retired_is_not_offered(api: Api, tools: tool_pb2_grpc.ToolServiceStub) -> None:
    listed = await tools.ListTools(tool_pb2.ListToolsRequest(workspace_id=api.ws))
    names = {t.name for t in listed.tools}
    assert {"desk__create_ticket", "desk__add_note"} <= names
    assert "desk__list_tickets" not in names
    latest = (
        await tools.GetTool(tool_pb2.GetToolRequest(workspace_id=api.ws, name="desk__list_tickets"))
    ).tool
    assert (latest.version, latest.retired) == (2, True)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await api.publish("lister", "mcp_desk", ["desk__list_tickets"])
    assert refused.value.code() == CODE.INVALID_ARGUMENT
    assert "spec.tools[0]" in refused.value.details() and "retired" in refused.value.details()
