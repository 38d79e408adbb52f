"""McpServerService: a workspace's remote MCP servers and their tools in the registry.

Adding a server asks it for its tools (the control plane calls the server, with the
connection's token when it names one: fetched from the connections store for that one
request, never logged or stored) and saves the reads and the writes whose class a person
stated; the other writes come back as `pending`. A sync re-reads tools/list and answers
with the diff and its digest; with `apply` it saves it (with `expect_digest`, only if the
diff is still the one the caller was shown). A tool the server no longer lists is reported
as removed, and applying retires it: a new registry version marked `retired`, which
ListTools leaves out and a publish refuses. Its earlier versions stay: agent versions that
pinned one keep it, and their calls fail as a tool error (nothing sent) while the server
does not serve the tool. Each server has a call deadline (`timeout_seconds`, 0-300, 0: the
platform default) copied into its tools' entries.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import urlsplit

import grpc

from agentrun.v1 import tool_pb2, tool_pb2_grpc
from control_plane.api.tools import prepared, save
from control_plane.auth import audit
from control_plane.auth import context as auth_context
from control_plane.connections.tokens import ConnectionTokens
from control_plane.ground import convert
from control_plane.ground.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from control_plane.store import connections as connections_store
from control_plane.store import mcp_servers as store
from control_plane.store import tools as tools_store
from control_plane.store.db import Connection, Pool, transaction
from control_plane.store.mcp_servers import McpServerRow
from control_plane.tools import definitions, mcp_sync

SERVER_ID = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
CONNECTION = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
MAX_URL = 2048
SOURCE = "mcp"
MAX_TIMEOUT_SECONDS = definitions.MAX_TIMEOUT_SECONDS


class McpServerServicer(tool_pb2_grpc.McpServerServiceServicer):
    def __init__(self, pool: Pool, tokens: ConnectionTokens | None) -> None:
        self._pool = pool
        self._tokens = tokens

    async def AddMcpServer(
        self, request: tool_pb2.AddMcpServerRequest, context: grpc.aio.ServicerContext
    ) -> tool_pb2.AddMcpServerResponse:
        ws = auth_context.workspace(request.workspace_id)
        server_id = _server_id(request.server_id)
        url = _url(request.url)
        connection = _connection(request.connection)
        timeout = _timeout(request.timeout_seconds)
        if await store.get(self._pool, ws, server_id) is not None:
            raise AlreadyExists(f"MCP server {server_id!r} is already registered; sync it")
        proposed = await self._snapshot(ws, server_id, url, connection, timeout)
        current = await _server_tools(self._pool, ws, server_id)
        changes = mcp_sync.diff(current, proposed)
        confirmed = mcp_sync.confirm(changes, current, request.classes)
        _validate(confirmed.ready)
        who = auth_context.current().label
        async with transaction(self._pool) as conn:
            row = await store.insert(conn, ws, server_id, url, connection, who, timeout)
            if row is None:
                raise AlreadyExists(f"MCP server {server_id!r} is already registered; sync it")
            saved = [(await save(conn, ws, tool, SOURCE))[0] for tool in confirmed.ready]
        return tool_pb2.AddMcpServerResponse(
            server=_to_proto(row, [t.name for t in saved]),
            tools=saved,
            pending=confirmed.pending,
        )

    async def GetMcpServer(
        self, request: tool_pb2.GetMcpServerRequest, context: grpc.aio.ServicerContext
    ) -> tool_pb2.GetMcpServerResponse:
        ws = auth_context.workspace(request.workspace_id)
        row = await self._get(ws, request.server_id)
        tools = await _server_tools(self._pool, ws, row.server_id)
        return tool_pb2.GetMcpServerResponse(server=_to_proto(row, [t.name for t in tools]))

    async def ListMcpServers(
        self, request: tool_pb2.ListMcpServersRequest, context: grpc.aio.ServicerContext
    ) -> tool_pb2.ListMcpServersResponse:
        ws = auth_context.workspace(request.workspace_id)
        rows = await store.list_for(self._pool, ws)
        by_server: dict[str, list[str]] = {}
        for tool in await _all_tools(self._pool, ws):
            if tool.source == SOURCE and tool.WhichOneof("transport") == "mcp":
                by_server.setdefault(tool.mcp.server_id, []).append(tool.name)
        servers = [_to_proto(row, by_server.get(row.server_id, [])) for row in rows]
        return tool_pb2.ListMcpServersResponse(servers=servers)

    async def SyncMcpServer(
        self, request: tool_pb2.SyncMcpServerRequest, context: grpc.aio.ServicerContext
    ) -> tool_pb2.SyncMcpServerResponse:
        ws = auth_context.workspace(request.workspace_id)
        row = await self._get(ws, request.server_id)
        timeout = _timeout(request.timeout_seconds) or row.timeout_seconds
        proposed = await self._snapshot(ws, row.server_id, row.url, row.connection, timeout)
        current = await _server_tools(self._pool, ws, row.server_id)
        changes = mcp_sync.diff(current, proposed, restated=list(request.classes))
        confirmed = mcp_sync.confirm(changes, current, request.classes)
        _validate(confirmed.ready)
        waiting = {c.name for c in confirmed.pending}
        for change in changes:
            change.needs_class = change.name in waiting
        answer = tool_pb2.SyncMcpServerResponse(changes=changes, digest=mcp_sync.digest(changes))
        if not request.apply:
            return answer
        if request.expect_digest and request.expect_digest != answer.digest:
            raise FailedPrecondition(
                "the server's tools changed since that diff (digest "
                f"{answer.digest}, not {request.expect_digest}): nothing "
                "saved; sync again to see the diff"
            )
        async with transaction(self._pool) as conn:
            for tool in confirmed.ready:
                answer.tools.append((await save(conn, ws, tool, SOURCE))[0])
            for tool in confirmed.retired:
                answer.tools.append(await _retire(conn, ws, tool))
            await store.synced(conn, ws, row.server_id, request.timeout_seconds or None)
        return answer

    async def _get(self, workspace_id: str, server_id: str) -> McpServerRow:
        row = await store.get(self._pool, workspace_id, _server_id(server_id))
        if row is None:
            raise NotFound(f"MCP server {server_id!r} is not registered in this workspace")
        return row

    async def _snapshot(
        self, workspace_id: str, server_id: str, url: str, connection: str, call_timeout: float
    ) -> list[tool_pb2.Tool]:
        headers = await self._headers(workspace_id, connection)
        try:
            return await mcp_sync.snapshot(
                url, headers, server_id=server_id, connection=connection, call_timeout=call_timeout
            )
        except mcp_sync.McpUnreachable as exc:
            raise FailedPrecondition(str(exc)) from None

    async def _headers(self, workspace_id: str, connection: str) -> Mapping[str, str]:
        """The Authorization header of the workspace's active connection of that provider
        (for this one request only), or none without a connection."""
        if not connection:
            return {}
        rows = await connections_store.list_for(self._pool, workspace_id)
        active = [r for r in rows if r.provider == connection and r.status == "active"]
        if not active or self._tokens is None:
            raise FailedPrecondition(
                f"no active connection for provider {connection!r} in "
                "this workspace: connect one first"
            )
        try:
            token = await self._tokens.for_call(workspace_id, active[0].connection_id)
        except Exception as exc:  # noqa: BLE001 - refresh failures have their own types
            raise FailedPrecondition(
                f"connection for provider {connection!r} cannot be used now ({type(exc).__name__})"
            ) from None
        return {"Authorization": f"Bearer {token.access_token}"}


def _server_id(value: str) -> str:
    if not SERVER_ID.match(value):
        raise InvalidArgument(
            "server_id",
            "must be 1-63 lowercase letters, digits, '_' or '-', starting with a letter",
        )
    return value


def _url(value: str) -> str:
    if not value:
        raise InvalidArgument("url", "is required: the server's streamable HTTP endpoint")
    parts = urlsplit(value)
    if len(value) > MAX_URL or parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgument("url", "must be an absolute http(s) URL")
    definitions.reachable("url", value)
    if parts.username or parts.password:
        raise InvalidArgument("url", "may not carry credentials (name a connection instead)")
    if parts.fragment:
        raise InvalidArgument("url", "may not have a fragment")
    return value


def _timeout(value: float) -> float:
    if not 0 <= value <= MAX_TIMEOUT_SECONDS:
        raise InvalidArgument(
            "timeout_seconds",
            f"must be between 0 and {MAX_TIMEOUT_SECONDS:g} seconds (0: the platform default)",
        )
    return value


async def _retire(conn: Connection, workspace_id: str, tool: tool_pb2.Tool) -> tool_pb2.Tool:
    """Save the retired version of a tool the server dropped (it was validated when it was
    saved; retiring changes nothing else), audited like any new version."""
    who = auth_context.current().label
    saved, created = await tools_store.save_tool_version(
        conn, workspace_id, prepared(tool), who, SOURCE
    )
    if created:
        await audit.record(conn, "tool.retired", "tool", saved.name, {"version": saved.version})
    return saved


def _connection(value: str) -> str:
    if value and not CONNECTION.match(value):
        raise InvalidArgument("connection", "must be a provider name (lowercase) or empty")
    return value


def _validate(tools: list[tool_pb2.Tool]) -> None:
    """Every proposal checked before anything is written. A definition the server made
    unsavable is the server's doing, not the caller's: FAILED_PRECONDITION naming the tool."""
    seen: dict[str, str] = {}
    for tool in tools:
        if tool.name in seen:
            raise FailedPrecondition(
                f"the server's tools {seen[tool.name]!r} and "
                f"{tool.mcp.tool!r} both become {tool.name!r}"
            )
        seen[tool.name] = tool.mcp.tool
        try:
            definitions.validate(prepared(tool))
        except InvalidArgument as exc:
            raise FailedPrecondition(
                f"the server's tool {tool.mcp.tool!r} cannot be saved: {exc}"
            ) from None


def _to_proto(row: McpServerRow, tools: list[str]) -> tool_pb2.McpServer:
    server = tool_pb2.McpServer(
        workspace_id=row.workspace_id,
        server_id=row.server_id,
        url=row.url,
        connection=row.connection,
        tools=sorted(tools),
        timeout_seconds=row.timeout_seconds,
    )
    if (created := convert.timestamp(row.created_at)) is not None:
        server.create_time.CopyFrom(created)
    if (synced := convert.timestamp(row.last_sync_at)) is not None:
        server.last_sync_time.CopyFrom(synced)
    return server


async def _all_tools(pool: Pool, workspace_id: str) -> list[tool_pb2.Tool]:
    """Every tool the workspace sees (the registry pages by name)."""
    found: list[tool_pb2.Tool] = []
    after: str | None = None
    while True:
        page = await tools_store.list_tools(pool, workspace_id, after=after, limit=1000)
        found.extend(page)
        if len(page) < 1000:
            return found
        after = page[-1].name


async def _server_tools(pool: Pool, workspace_id: str, server_id: str) -> list[tool_pb2.Tool]:
    """The registry's latest entries of this server's tools (the workspace's own only)."""
    return [
        t
        for t in await _all_tools(pool, workspace_id)
        if t.workspace_id == workspace_id
        and t.source == SOURCE
        and t.WhichOneof("transport") == "mcp"
        and t.mcp.server_id == server_id
    ]
