"""The tool registry through ToolService (in-process control plane, real Postgres): versions,
idempotent saves, refusals naming the field with nothing written, shadowing of shared
entries, and workspaces that never see each other's tools."""

from __future__ import annotations

import json

import grpc
import pytest

from agentrun.v1 import agent_pb2, agent_pb2_grpc, tool_pb2, tool_pb2_grpc
from control_plane.store import tools as tool_store
from tests.harness import auth

SCHEMA = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}


def http_tool(name: str, url: str, **fields) -> tool_pb2.Tool:
    return tool_pb2.Tool(
        name=name,
        description=fields.pop("description", "read a thing"),
        parameters_json=json.dumps(SCHEMA),
        access=fields.pop("access", tool_pb2.TOOL_ACCESS_READ),
        connection="tracker",
        http=tool_pb2.HttpTemplate(method="GET", url=url, auth="bearer"),
        **fields,
    )


async def stub(server, db_url: str, ws: str, role: str = "admin"):
    key = await auth.workspace_key(db_url, ws, role=role)
    channel = auth.channel(f"127.0.0.1:{server.port}", key)
    return channel, tool_pb2_grpc.ToolServiceStub(channel)


async def test_versions_are_saved_once_each_and_shadow_shared_entries(server, db_url, db):
    channel, tools = await stub(server, db_url, "acme")
    async with channel:
        first = await tools.CreateTool(
            tool_pb2.CreateToolRequest(tool=http_tool("thing_get", "https://a.example/things/{id}"))
        )
        again = await tools.CreateTool(
            tool_pb2.CreateToolRequest(tool=http_tool("thing_get", "https://a.example/things/{id}"))
        )
        second = await tools.CreateTool(
            tool_pb2.CreateToolRequest(
                tool=http_tool("thing_get", "https://a.example/v2/things/{id}")
            )
        )
        assert (first.created, first.tool.version) == (True, 1)
        assert (again.created, again.tool.version) == (False, 1)
        assert (second.created, second.tool.version) == (True, 2)
        assert first.tool.created_by.startswith("key:") and first.tool.source == "api"
        got = await tools.GetTool(tool_pb2.GetToolRequest(name="thing_get", version=1))
        assert got.tool.http.url == "https://a.example/things/{id}"
        # A workspace tool named like a built-in shadows it, for this workspace only.
        await tools.CreateTool(
            tool_pb2.CreateToolRequest(tool=http_tool("echo", "https://a.example/echo/{id}"))
        )
        listed = await tools.ListTools(tool_pb2.ListToolsRequest())
        by_name = {t.name: t for t in listed.tools}
        assert by_name["echo"].workspace_id == "acme" and not by_name["echo"].builtin
        assert by_name["thing_get"].version == 2
        assert by_name["crm_upsert"].builtin and by_name["crm_upsert"].source == "builtin"
    assert await db.fetchval("SELECT count(*) FROM tools WHERE workspace_id = 'acme'") == 3


async def test_two_workspaces_never_see_each_others_tools(server, db_url, db):
    a_channel, a = await stub(server, db_url, "acme")
    b_channel, b = await stub(server, db_url, "globex")
    async with a_channel, b_channel:
        await a.CreateTool(
            tool_pb2.CreateToolRequest(
                tool=http_tool("lookup", "https://acme.example/{id}", description="acme's")
            )
        )
        await b.CreateTool(
            tool_pb2.CreateToolRequest(
                tool=http_tool("lookup", "https://globex.example/{id}", description="globex's")
            )
        )
        got_a = (await a.GetTool(tool_pb2.GetToolRequest(name="lookup"))).tool
        got_b = (await b.GetTool(tool_pb2.GetToolRequest(name="lookup"))).tool
        assert (got_a.workspace_id, got_a.http.url) == ("acme", "https://acme.example/{id}")
        assert (got_b.workspace_id, got_b.http.url) == ("globex", "https://globex.example/{id}")
        listed_b = (await b.ListTools(tool_pb2.ListToolsRequest())).tools
        assert "acme" not in str(listed_b)
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await b.GetTool(tool_pb2.GetToolRequest(workspace_id="acme", name="lookup"))
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # What an assignment carries: even a pin naming acme's entry yields nothing for globex.
    forged = [tool_store.Pin("lookup", "acme", 1), tool_store.Pin("lookup", "globex", 1)]
    carried = await tool_store.pinned(db, "globex", forged)
    assert [(t.workspace_id, t.http.url) for t in carried] == [
        ("globex", "https://globex.example/{id}")
    ]


async def test_bad_definitions_are_refused_naming_the_field_and_nothing_is_written(
    server, db_url, db
):
    channel, tools = await stub(server, db_url, "acme")
    bad = http_tool("leaky", "https://a.example/{id}")
    bad.http.headers["Authorization"] = "Bearer sk-live-123"
    write = http_tool("poster", "https://a.example/{id}", access=tool_pb2.TOOL_ACCESS_WRITE)
    write.http.method = "POST"
    async with channel:
        for tool, field in ((bad, "tool.http.headers[Authorization]"), (write, "tool.idempotency")):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await tools.CreateTool(tool_pb2.CreateToolRequest(tool=tool))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert refused.value.details().startswith(field), refused.value.details()
            assert "sk-live-123" not in refused.value.details()
    assert await db.fetchval("SELECT count(*) FROM tools WHERE workspace_id <> ''") == 0


async def test_publishing_a_tool_the_workspace_cannot_see_is_refused_naming_it(server, db_url):
    a_channel, a = await stub(server, db_url, "acme")
    b_key = await auth.workspace_key(db_url, "globex", role="admin")
    async with a_channel, auth.channel(f"127.0.0.1:{server.port}", b_key) as b_channel:
        await a.CreateTool(
            tool_pb2.CreateToolRequest(tool=http_tool("acme_only", "https://acme.example/{id}"))
        )
        agents = agent_pb2_grpc.AgentServiceStub(b_channel)
        await agents.CreateAgent(agent_pb2.CreateAgentRequest(agent_id="bot"))
        for tools, field in ((["echo", "acme_only"], "spec.tools[1]"), (["nope"], "spec.tools[0]")):
            spec = agent_pb2.AgentSpec(
                model="demo", tools=tools, connections={"tracker": "trigger"}
            )
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await agents.PublishAgentVersion(
                    agent_pb2.PublishAgentVersionRequest(agent_id="bot", spec=spec)
                )
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert refused.value.details().startswith(field), refused.value.details()
        # Its own tool of a connection the spec does not name is refused too, naming that.
        await (tool_pb2_grpc.ToolServiceStub(b_channel)).CreateTool(
            tool_pb2.CreateToolRequest(tool=http_tool("globex_get", "https://globex.example/{id}"))
        )
        spec = agent_pb2.AgentSpec(model="demo", tools=["globex_get"])
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await agents.PublishAgentVersion(
                agent_pb2.PublishAgentVersionRequest(agent_id="bot", spec=spec)
            )
        assert refused.value.details().startswith("spec.connections[tracker]")
        spec.connections["tracker"] = "trigger"
        done = await agents.PublishAgentVersion(
            agent_pb2.PublishAgentVersionRequest(agent_id="bot", spec=spec)
        )
        assert dict(done.version.tool_versions) == {"globex_get": 1}
        got = await agents.GetAgentVersion(agent_pb2.GetAgentVersionRequest(agent_id="bot"))
        assert dict(got.version.tool_versions) == {"globex_get": 1}
