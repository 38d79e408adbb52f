"""A run's tool set: the executor's built-ins plus the registry tools its assignment carries.

The control plane sends, with each assignment, the definitions of the workspace's own
registry tools the run's agent version pinned (Assignment.tools; never another workspace's).
They are called from those definitions (an HTTP template, a remote MCP server's tool), so
any executor runs them; the built-ins still come from this executor's catalogue, because
they need its code, and a run needing one is only assigned to executors that carry it. A
workspace tool named like a built-in shadows it for that run.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable

from agentrun.v1 import tool_pb2
from executor.tools.catalogue import Catalogue, Lookup, McpTarget, Tool
from executor.tools.template import HttpTemplate

log = logging.getLogger(__name__)

DEFAULT_KEY_HEADER = "Idempotency-Key"
_KINDS = {tool_pb2.TOOL_ACCESS_READ: "read", tool_pb2.TOOL_ACCESS_WRITE: "write"}
_CLASSES = {
    tool_pb2.IDEMPOTENCY_CLASS_PROVIDER_KEY: "provider_key",
    tool_pb2.IDEMPOTENCY_CLASS_LOOKUP: "lookup",
    tool_pb2.IDEMPOTENCY_CLASS_NONE: "none",
}
TRIGGER = "trigger"


def from_proto(tool: tool_pb2.Tool) -> Tool:
    """A registry definition as the executor's Tool (ValueError when it cannot be one)."""
    kind = _KINDS.get(tool.access)
    if kind is None:
        raise ValueError(f"tool {tool.name!r}: access must be read or write")
    http, mcp = _transport(tool)
    named = tool.connection and tool.connection != TRIGGER
    return Tool(
        name=tool.name,
        description=tool.description,
        provider=tool.connection if named else f"tool:{tool.name}",
        method=tool.http.method if http else None,
        path=tool.http.url if http else None,
        kind=kind,
        idempotency=_CLASSES.get(tool.idempotency) if kind == "write" else None,
        parameters=json.loads(tool.parameters_json),
        scopes=tuple(tool.scopes),
        moves_money="moves_money" in tool.capabilities,
        needs_approval=tool.needs_approval,
        rate_bucket=tool.rate_bucket or tool.name,
        lookup=_lookup(tool),
        key_retention_hours=tool.key_retention_hours or None,
        version=str(tool.version),
        capabilities=tuple(tool.capabilities),
        http=http,
        mcp=mcp,
        connection=tool.connection,
        idempotency_header=tool.idempotency_header or DEFAULT_KEY_HEADER,
    )


def _transport(tool: tool_pb2.Tool) -> tuple[HttpTemplate | None, McpTarget | None]:
    which = tool.WhichOneof("transport")
    if which == "http":
        h = tool.http
        return HttpTemplate(
            method=h.method,
            url=h.url,
            headers=dict(h.headers),
            query=dict(h.query),
            body=h.body,
            response_pointer=h.response_pointer,
            max_response_bytes=h.max_response_bytes,
            timeout_seconds=h.timeout_seconds,
            auth=h.auth,
        ), None
    if which == "mcp":
        m = tool.mcp
        return None, McpTarget(m.server_id, m.tool, m.url, m.key_argument, m.timeout_seconds)
    raise ValueError(f"tool {tool.name!r} has no transport")


def _lookup(tool: tool_pb2.Tool) -> Lookup | None:
    if not tool.HasField("lookup"):
        return None
    spec = tool.lookup
    return Lookup(
        body_field=spec.stamp_body_field,
        header_name=spec.stamp_name,
        path=spec.url,
        query=dict(spec.query),
        matches=spec.matches,
        settle_seconds=spec.settle_seconds or 1.0,
    )


def for_run(catalogue: Catalogue, assigned: Iterable[tool_pb2.Tool]) -> Catalogue:
    """The catalogue a run calls its tools from: the built-ins, shadowed by its registry
    tools. A definition that cannot be used is left out (a call of it is then refused as an
    unknown tool: nothing is sent)."""
    own: dict[str, Tool] = {}
    for tool in assigned:
        if tool.builtin:
            continue
        try:
            own[tool.name] = from_proto(tool)
        except ValueError as exc:
            log.error("registry tool %s v%d left out: %s", tool.name, tool.version, exc)
    if not own:
        return catalogue
    return Catalogue(
        tools={**catalogue.tools, **own}, key_retention_hours=catalogue.key_retention_hours
    )
