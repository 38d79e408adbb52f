"""ToolService: a workspace's tools, as data (tool.proto). ImportOpenApi is built on `save`."""

from __future__ import annotations

import asyncio

import grpc

from agentrun.v1 import tool_pb2, tool_pb2_grpc
from control_plane.api.admin import keyset_page, text_token
from control_plane.auth import audit
from control_plane.auth import context as auth_context
from control_plane.ground import validate
from control_plane.ground.errors import InvalidArgument, NotFound
from control_plane.store import tools as store
from control_plane.store.db import Connection, Pool, transaction
from control_plane.tools import definitions, openapi

# The sources a caller may say a definition came from; the importers set their own.
CALLER_SOURCES = ("api", "file")
SERVER_FIELDS = ("workspace_id", "version", "builtin", "create_time", "created_by", "source")


def prepared(tool: tool_pb2.Tool) -> tool_pb2.Tool:
    """A copy of a caller's definition without the fields the server sets."""
    bare = tool_pb2.Tool()
    bare.CopyFrom(tool)
    for name in SERVER_FIELDS:
        bare.ClearField(name)  # type: ignore[arg-type]
    return bare


async def save(
    db: Pool | Connection, workspace_id: str, tool: tool_pb2.Tool, source: str
) -> tuple[tool_pb2.Tool, bool]:
    """Validate (InvalidArgument naming the field) and save a new version of a workspace
    tool as the current principal, audited with the write; (saved or latest, created).

    The one way a workspace tool enters the registry: CreateTool, the OpenAPI import and
    MCP sync all save through it (each with its `source`)."""
    bare = prepared(tool)
    definitions.validate(bare)
    who = auth_context.current().label
    async with transaction(db) as conn:
        saved, created = await store.save_tool_version(conn, workspace_id, bare, who, source)
        if created:
            await audit.record(
                conn,
                "tool.created",
                "tool",
                saved.name,
                {"version": saved.version, "source": source},
            )
    return saved, created


class ToolServicer(tool_pb2_grpc.ToolServiceServicer):
    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def CreateTool(
        self, request: tool_pb2.CreateToolRequest, context: grpc.aio.ServicerContext
    ) -> tool_pb2.CreateToolResponse:
        ws = auth_context.workspace(request.workspace_id)
        if not request.HasField("tool"):
            raise InvalidArgument("tool", "is required")
        source = request.tool.source or "api"
        if source not in CALLER_SOURCES:
            raise InvalidArgument("tool.source", f"must be one of {', '.join(CALLER_SOURCES)}")
        saved, created = await save(self._pool, ws, request.tool, source)
        return tool_pb2.CreateToolResponse(tool=saved, created=created)

    async def GetTool(
        self, request: tool_pb2.GetToolRequest, context: grpc.aio.ServicerContext
    ) -> tool_pb2.GetToolResponse:
        ws = auth_context.workspace(request.workspace_id)
        name = tool_name("name", request.name)
        version = validate.non_negative("version", request.version)
        found = await store.get_tool(self._pool, ws, name, version)
        if found is None:
            raise NotFound(f"tool {name!r} has no version {version or 'saved'}")
        return tool_pb2.GetToolResponse(tool=found)

    async def ListTools(
        self, request: tool_pb2.ListToolsRequest, context: grpc.aio.ServicerContext
    ) -> tool_pb2.ListToolsResponse:
        ws = auth_context.workspace(request.workspace_id)

        async def fetch(after: str | None, limit: int) -> list[tool_pb2.Tool]:
            return await store.list_tools(self._pool, ws, after, limit)

        tools, token = await keyset_page(request, text_token(64), fetch, lambda t: t.name)
        return tool_pb2.ListToolsResponse(tools=tools, next_page_token=token)

    async def ImportOpenApi(
        self, request: tool_pb2.ImportOpenApiRequest, context: grpc.aio.ServicerContext
    ) -> tool_pb2.ImportOpenApiResponse:
        """Convert the chosen operations (control_plane/tools/openapi.py), then save them all
        in one transaction (source "openapi"), or with dry_run return them unsaved."""
        ws = auth_context.workspace(request.workspace_id)
        spec = openapi.ImportSpec.from_request(request)
        # Parsing and validating a large document is CPU work: off the event loop.
        tools = await asyncio.to_thread(openapi.import_tools, request.document, spec)
        if request.dry_run:
            for tool in tools:
                tool.workspace_id = ws
            return tool_pb2.ImportOpenApiResponse(tools=tools)
        async with transaction(self._pool) as conn:
            saved = [(await save(conn, ws, tool, "openapi"))[0] for tool in tools]
        return tool_pb2.ImportOpenApiResponse(tools=saved)


def tool_name(field: str, value: str) -> str:
    if not value:
        raise InvalidArgument(field, "is required")
    if not definitions.NAME.match(value):
        raise InvalidArgument(field, "must be 1-64 letters, digits, '_' or '-'")
    return value
