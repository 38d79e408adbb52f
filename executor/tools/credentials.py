"""The connected account a tool call acts as, and its token fetched just before it leaves.

An agent version names a connection per provider (`AgentSpec.connections`). For a tool of
such a provider the run hands its delivery a `Credential`; the HTTP client asks it for the
`Authorization` header right before each request goes out, so the control plane can refresh
the token (single-flight) at the moment it is needed. The token lives only in that header:
`Credential` keeps no copy, has no token in its repr, and errors never quote it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from agentrun.v1 import executor_pb2
from executor import steps
from executor.replay import INPUT, PARK, Entry
from executor.tools.catalogue import Tool, ToolCallRejected

WAIT_REASON = "connection"
# `connections[provider] = "trigger"`: the tool acts as the account the run came in through,
# which the run's input step records (control_plane/connections/triggering.py).
TRIGGER = "trigger"
TRIGGER_FIELD = "trigger_connection_id"


class ConnectionUnusable(Exception):
    """The connection cannot be used (revoked, needs reauth, its scope was removed):
    nothing was sent (or the provider refused it before acting); the run waits for it.

    Not a ToolSendError: the delivery does not retry it, the run loop parks on it.
    """

    def __init__(self, connection_id: str, why: str) -> None:
        super().__init__(f"connection {connection_id} {why}")
        self.connection_id = connection_id
        self.why = why


@dataclass(frozen=True)
class Granted:
    """What GetConnectionToken answered: the token and the scopes the grant holds."""

    scopes: tuple[str, ...]
    access_token: str = field(repr=False)


# (connection id) -> its token and scopes, from ExecutorService.GetConnectionToken; raises
# ConnectionUnusable when the control plane says the connection cannot be used.
FetchToken = Callable[[str], Awaitable[Granted]]


def required_scope(tool: Tool) -> str:
    """The scope a tool needs of its provider's grant: `provider:read` or `provider:write`."""
    return f"{tool.provider}:{'read' if tool.kind == 'read' else 'write'}"


@dataclass(frozen=True)
class Credential:
    connection_id: str
    fetch: FetchToken = field(repr=False)
    scope: str = ""

    async def header(self) -> str:
        """The Authorization header; ConnectionUnusable, before anything is sent, when the
        grant does not hold the scope the tool needs."""
        granted = await self.fetch(self.connection_id)
        if self.scope and self.scope not in granted.scopes:
            raise ConnectionUnusable(self.connection_id, f"lacks the scope {self.scope}")
        return f"Bearer {granted.access_token}"


def triggering(entries: Sequence[Entry]) -> str:
    """The connection the run came in through ("" : none), from its input step."""
    first = entries[0] if entries else None
    if first is None or first.kind != INPUT:
        return ""
    return str(first.payload.get(TRIGGER_FIELD) or "")


def account_of(connections: Mapping[str, str], tool: Tool, trigger: str) -> str:
    """The connection the tool acts as ("": the default account). ToolCallRejected (nothing is
    sent) when it is the triggering account and the run came in through no connection."""
    named = connections.get(tool.provider, "")
    if named != TRIGGER:
        return named
    if not trigger:
        raise ToolCallRejected(
            f"{tool.name} acts as the run's triggering account (connections[{tool.provider}] "
            f'is "{TRIGGER}"), but this run came in through no connection: nothing was sent'
        )
    return trigger


def for_tool(
    connections: Mapping[str, str], tool: Tool, fetch: FetchToken | None, trigger: str = ""
) -> Credential | None:
    """The credential for the tool's provider; None: the unauthenticated default account."""
    connection_id = account_of(connections, tool, trigger)
    if not connection_id or fetch is None:
        return None
    return Credential(connection_id, fetch, required_scope(tool))


def park_step(seq: int, exc: ConnectionUnusable, call_seq: int, epoch: int) -> executor_pb2.NewStep:
    """The park on a connection; it records the call as never sent under lease `epoch`, so
    it goes out on resume whatever its class (executor/ratelimit/parks.py's `unsent`)."""
    return steps.new_step(seq, PARK, {
        "wait_reason": WAIT_REASON, "note": str(exc), "connection_id": exc.connection_id,
        "unsent_call_seq": call_seq, "epoch": epoch,
    })  # fmt: skip
