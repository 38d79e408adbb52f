"""What PublishAgentVersion asks before it writes: can the tools run, and are they safe together."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agentrun.v1 import agent_pb2, tool_pb2
from control_plane.ground.errors import InvalidArgument
from control_plane.store import executor_tools
from control_plane.store import tools as tool_store
from control_plane.store.db import Connection, Pool
from control_plane.store.tools import Pin
from control_plane.tools import registry, trifecta
from control_plane.tools.registry import PublishWarning

TRIGGER = "trigger"


@dataclass(frozen=True)
class Checked:
    """A version that may be published: what to tell the publisher, the registry versions
    it pins, and the built-ins (tools needing executor code) its runs need executors for."""

    warnings: list[PublishWarning]
    pins: list[Pin]
    code_tools: list[str]


def marks(tool: tool_pb2.Tool) -> frozenset[str]:
    return frozenset(tool.capabilities)


def check_connections(spec: agent_pb2.AgentSpec, own: Mapping[str, tool_pb2.Tool]) -> None:
    """A workspace tool that sends a token needs its connection named in spec.connections."""
    for name, tool in own.items():
        if (
            tool.connection
            and tool.connection != TRIGGER
            and tool.connection not in (spec.connections)
        ):
            raise InvalidArgument(
                f"spec.connections[{tool.connection}]",
                f"is required: tool {name!r} acts as a {tool.connection!r} connection",
            )


def _refuse_retired(spec: agent_pb2.AgentSpec, resolved: Mapping[str, tool_pb2.Tool]) -> None:
    """A retired tool (its MCP server stopped listing it) is no longer offered."""
    for i, name in enumerate(spec.tools):
        tool = resolved.get(name)
        if tool is not None and tool.retired:
            raise InvalidArgument(
                f"spec.tools[{i}]",
                f"tool {name!r} was retired in version "
                f"{tool.version}: its MCP server {tool.mcp.server_id!r} no "
                "longer lists it",
            )


@dataclass(frozen=True)
class PublishGuard:
    """The tool checks of a publish (control_plane/tools/__init__.py says why)."""

    # How long after it was last seen an executor still counts as connected.
    live_seconds: float
    catalogue: Mapping[str, frozenset[str]]
    # "warn": a trifecta is published with a warning; "acknowledge": only with
    # acknowledge_trifecta on the request.
    trifecta_policy: str = "warn"

    async def check(
        self,
        conn: Pool | Connection,
        workspace_id: str,
        request: agent_pb2.PublishAgentVersionRequest,
    ) -> Checked:
        """What to publish with, or InvalidArgument when the version must not be published.

        spec.tools resolve against the registry as the workspace sees it (its own entries
        shadow shared ones); the latest version of each is pinned. A name the registry lacks
        may still be a built-in a connected pool declares (its executor code predates the
        registry); one nobody knows is refused naming spec.tools[i]."""
        spec = request.spec
        resolved = await tool_store.resolve(conn, workspace_id, list(spec.tools))
        _refuse_retired(spec, resolved)
        own = {name: t for name, t in resolved.items() if not t.builtin}
        check_connections(spec, own)
        live = await executor_tools.live_for(conn, workspace_id, self.live_seconds)
        pools = [registry.Pool.from_declared(ex, tools) for ex, tools in live]
        portable = {name: marks(t) for name, t in own.items()}
        checked = registry.check(list(spec.tools), pools, self.catalogue, portable)
        # The registry's marks; a built-in's as the connected pools declare it, if they do.
        capabilities = {**{n: marks(t) for n, t in resolved.items()}, **checked.capabilities}
        warnings = self._trifecta(request, capabilities, list(checked.warnings))
        pins = [Pin(n, t.workspace_id, t.version) for n, t in resolved.items()]
        return Checked(warnings, pins, [name for name in spec.tools if name not in own])

    def _trifecta(
        self,
        request: agent_pb2.PublishAgentVersionRequest,
        capabilities: Mapping[str, frozenset[str]],
        warnings: list[PublishWarning],
    ) -> list[PublishWarning]:
        spec = request.spec
        gated = {*spec.approval.tools, *spec.approval.high_risk_tools}
        found = trifecta.warning(capabilities, gated)
        if found is not None:
            if self.trifecta_policy == "acknowledge" and not request.acknowledge_trifecta:
                raise InvalidArgument(
                    "acknowledge_trifecta", f"is required to publish this set: {found.message}"
                )
            warnings.insert(0, found)
        return warnings


def to_proto(warnings: list[PublishWarning]) -> list[agent_pb2.PublishWarning]:
    return [
        agent_pb2.PublishWarning(code=w.code, message=w.message, tools=list(w.tools))
        for w in warnings
    ]
