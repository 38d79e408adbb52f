"""What PublishAgentVersion asks before it writes: can the tools run, and are they safe together."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agentrun.v1 import agent_pb2
from control_plane.errors import InvalidArgument
from control_plane.store import executor_tools
from control_plane.store.db import Connection, Pool
from control_plane.tools import registry, trifecta
from control_plane.tools.registry import PublishWarning


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
        self, conn: Pool | Connection, workspace_id: str,
        request: agent_pb2.PublishAgentVersionRequest,
    ) -> list[PublishWarning]:  # fmt: skip
        """The warnings to return, or InvalidArgument when the version must not be published."""
        spec = request.spec
        live = await executor_tools.live_for(conn, workspace_id, self.live_seconds)
        pools = [registry.Pool.from_declared(ex, tools) for ex, tools in live]
        checked = registry.check(list(spec.tools), pools, self.catalogue)
        warnings = list(checked.warnings)
        gated = {*spec.approval.tools, *spec.approval.high_risk_tools}
        found = trifecta.warning(checked.capabilities, gated)
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
