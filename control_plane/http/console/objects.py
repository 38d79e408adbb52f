"""Read-only pages for the workspace's other objects: sessions (with their turns), agents
and their versions (a diff between two), tools (the registry, OpenAPI and MCP sources,
idempotency classes) and MCP servers, connections, releases, credits.

Each reads through the store functions the servicers use, in the signed-in principal's
workspace only; nothing here writes. Secrets never reach a page: a connection shows its
state and scopes, never its tokens (they stay sealed in the row and are not read).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from agentrun.v1 import tool_pb2
from control_plane.auth import context as auth_context
from control_plane.auth import privacy
from control_plane.ground import validate
from control_plane.ground.errors import InvalidArgument, NotFound
from control_plane.http.console.timeline import diff, pretty
from control_plane.http.console.web import Console, render
from control_plane.http.console.workspace import RELEASE_LIVE_SECONDS
from control_plane.store import agents as agent_store
from control_plane.store import connections as connection_store
from control_plane.store import console as store
from control_plane.store import credits as credit_store
from control_plane.store import mcp_servers
from control_plane.store import releases as release_store
from control_plane.store import sessions as session_store
from control_plane.store import tools as tool_store

SHOWN = 200
IDEMPOTENCY = {
    tool_pb2.IDEMPOTENCY_CLASS_UNSPECIFIED: "unspecified",
    tool_pb2.IDEMPOTENCY_CLASS_PROVIDER_KEY: "provider key",
    tool_pb2.IDEMPOTENCY_CLASS_LOOKUP: "lookup",
    tool_pb2.IDEMPOTENCY_CLASS_NONE: "none (a person decides an unknown outcome)",
}


def _version(field: str, value: str) -> int | None:
    if not value:
        return None
    if not value.isascii() or not value.isdigit() or not 0 < int(value) < 2**31:
        raise InvalidArgument(field, "must be a version number (1 or more)")
    return int(value)


class ObjectPages:
    def __init__(self, console: Console) -> None:
        self.c = console

    async def sessions(self, request: Request) -> Response:
        rows = await store.sessions(
            self.c.pool, auth_context.workspace(""), SHOWN, privacy.reader()
        )
        return render(request, "sessions.html", sessions=rows)

    async def session(self, request: Request) -> Response:
        ws = auth_context.workspace("")
        session_id = validate.run_id("session_id", request.path_params["session_id"])
        await privacy.check_session(self.c.pool, ws, session_id, privacy.reader())
        row = await session_store.get_session(self.c.pool, ws, session_id)
        if row is None:
            raise NotFound(f"session {session_id} not found")
        turns = await store.session_turns(self.c.pool, ws, session_id, 500)
        return render(request, "session.html", session=dict(row), turns=turns)

    async def agents(self, request: Request) -> Response:
        rows = await agent_store.list_agents(self.c.pool, auth_context.workspace(""), None, SHOWN)
        return render(request, "agents.html", agents=[dict(r) for r in rows])

    async def agent(self, request: Request) -> Response:
        """An agent's versions; `a` and `b` choose two to diff (default: the newest two)."""
        ws = auth_context.workspace("")
        agent_id = validate.slug("agent_id", request.path_params["agent_id"])
        agent = await agent_store.get_agent(self.c.pool, ws, agent_id)
        if agent is None:
            raise NotFound(f"agent {agent_id} not found")
        versions = await store.agent_versions(self.c.pool, ws, agent_id, SHOWN)
        by_number = {v["version"]: v for v in versions}
        q = request.query_params
        a, b = _version("a", q.get("a", "")), _version("b", q.get("b", ""))
        if a is None and b is None and len(versions) >= 2:
            a, b = versions[1]["version"], versions[0]["version"]
        for name, chosen in (("a", a), ("b", b)):
            if chosen is not None and chosen not in by_number:
                raise NotFound(f"agent {agent_id} has no version {chosen} ({name})")
        changes = diff(by_number[a]["spec"], by_number[b]["spec"]) if a and b else []
        return render(
            request,
            "agent.html",
            agent=dict(agent),
            versions=versions,
            a=a,
            b=b,
            changes=changes,
            pretty=pretty,
        )

    async def tools(self, request: Request) -> Response:
        ws = auth_context.workspace("")
        tools = await tool_store.list_tools(self.c.pool, ws, None, SHOWN)
        servers = await mcp_servers.list_for(self.c.pool, ws, SHOWN)
        return render(
            request,
            "tools.html",
            tools=[_tool(t) for t in tools],
            servers=servers,
        )

    async def connections(self, request: Request) -> Response:
        rows = await connection_store.list_for(self.c.pool, auth_context.workspace(""), SHOWN)
        return render(request, "connections.html", connections=rows)

    async def releases(self, request: Request) -> Response:
        """Every release's routing, drain, ramp and canary, and this workspace's unfinished
        runs on each (executor names are the platform's: only their count is shown)."""
        states = await release_store.list_releases(self.c.pool, RELEASE_LIVE_SECONDS)
        mine = await store.runs_by_release(self.c.pool, auth_context.workspace(""))
        return render(request, "releases.html", releases=states, mine=mine)

    async def credits(self, request: Request) -> Response:
        ws = auth_context.workspace("")
        account = await credit_store.account(self.c.pool, ws)
        ledger = await credit_store.ledger_page(self.c.pool, ws, None, SHOWN)
        return render(request, "credits.html", account=account, ledger=ledger)


def _tool(t: tool_pb2.Tool) -> dict[str, Any]:
    transport = t.WhichOneof("transport") or ""
    target = ""
    if transport == "http":
        target = f"{t.http.method} {t.http.url}"
    elif transport == "mcp":
        target = f"{t.mcp.server_id}: {t.mcp.tool}"
    return {
        "name": t.name,
        "version": t.version,
        "scope": "shared" if not t.workspace_id else "workspace",
        "source": t.source or ("builtin" if t.builtin else "api"),
        "idempotency": IDEMPOTENCY.get(t.idempotency, str(t.idempotency)),
        "needs_approval": t.needs_approval,
        "connection": t.connection,
        "transport": transport or ("executor code" if t.builtin else ""),
        "target": target,
        "description": t.description,
        "retired": t.retired,
    }
