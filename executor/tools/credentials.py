"""The connected account a tool call acts as, and its token fetched just before it leaves.

An agent version names a connection per provider (`AgentSpec.connections`). For a tool of
such a provider the run hands its delivery a `Credential`; the HTTP client asks it for the
`Authorization` header right before each request goes out, so the control plane can refresh
the token (single-flight) at the moment it is needed. The token lives only in that header:
`Credential` keeps no copy, has no token in its repr, and errors never quote it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from agentrun.v1 import executor_pb2
from executor import steps
from executor.replay import PARK

WAIT_REASON = "connection"


class ConnectionUnusable(Exception):
    """The connection cannot be used (revoked, needs reauth, its scope was removed):
    nothing was sent (or the provider refused it before acting); the run waits for it.

    Not a ToolSendError: the delivery does not retry it, the run loop parks on it.
    """

    def __init__(self, connection_id: str, why: str) -> None:
        super().__init__(f"connection {connection_id} {why}")
        self.connection_id = connection_id
        self.why = why


# (connection id) -> the access token, from ExecutorService.GetConnectionToken; raises
# ConnectionUnusable when the control plane says the connection cannot be used.
FetchToken = Callable[[str], Awaitable[str]]


@dataclass(frozen=True)
class Credential:
    connection_id: str
    fetch: FetchToken = field(repr=False)

    async def header(self) -> str:
        return f"Bearer {await self.fetch(self.connection_id)}"


def for_provider(
    connections: Mapping[str, str], provider: str, fetch: FetchToken | None
) -> Credential | None:
    """The credential for `provider`'s tools; None: the unauthenticated default account."""
    connection_id = connections.get(provider)
    if not connection_id or fetch is None:
        return None
    return Credential(connection_id, fetch)


def park_step(seq: int, exc: ConnectionUnusable, call_seq: int, epoch: int) -> executor_pb2.NewStep:
    """The park on a connection; it records the call as never sent under lease `epoch`, so
    it goes out on resume whatever its class (executor/ratelimit/parks.py's `unsent`)."""
    return steps.new_step(seq, PARK, {
        "wait_reason": WAIT_REASON, "note": str(exc), "connection_id": exc.connection_id,
        "unsent_call_seq": call_seq, "epoch": epoch,
    })  # fmt: skip
