"""The servicers the gRPC server serves, handed to the HTTP/JSON API (control_plane/http/api.py)
so both doors call the same instances."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from control_plane.api.agents import AgentServicer
from control_plane.api.approvals import ApprovalServicer
from control_plane.api.runs import RunServicer
from control_plane.api.sessions import SessionServicer


@dataclass(frozen=True)
class Services:
    """The servicers the gRPC server serves, shared with the HTTP API (the same instances)."""

    runs: RunServicer
    approvals: ApprovalServicer
    sessions: SessionServicer
    agents: AgentServicer

    def method(self, rpc: str) -> Callable[..., Any]:
        service, name = rpc.split("/")
        servicer = {
            "RunService": self.runs,
            "ApprovalService": self.approvals,
            "SessionService": self.sessions,
            "AgentService": self.agents,
        }[service]
        return cast(Callable[..., Any], getattr(servicer, name))
