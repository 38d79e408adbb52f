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
from executor.tools.catalogue import Tool
from executor.tools.rejection import ToolCallRejected

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


def required_scope(tool: Tool) -> str | tuple[str, ...]:
    """The scopes a tool needs of its connection's grant: a registry tool's own `scopes` when
    it names some, else `provider:read` or `provider:write`."""
    access = "read" if tool.kind == "read" else "write"
    if tool.connection is None:
        return f"{tool.provider}:{access}"
    if tool.scopes:
        return tool.scopes
    # The triggering account's grant is for whichever provider the run came in through.
    return f"{tool.connection}:{access}" if tool.connection not in ("", TRIGGER) else ""


@dataclass(frozen=True)
class Credential:
    connection_id: str
    fetch: FetchToken = field(repr=False)
    scope: str | tuple[str, ...] = ""

    async def header(self) -> str:
        """The Authorization header; ConnectionUnusable, before anything is sent, when the
        grant does not hold the scope the tool needs."""
        return f"Bearer {await self.token()}"

    async def token(self) -> str:
        """The access token, for this one request only (a registry tool may send it in a
        header of its own); ConnectionUnusable when the grant lacks a scope the tool needs."""
        granted = await self.fetch(self.connection_id)
        needed = (self.scope,) if isinstance(self.scope, str) else self.scope
        for scope in needed:
            if scope and scope not in granted.scopes:
                raise ConnectionUnusable(self.connection_id, f"lacks the scope {scope}")
        return granted.access_token


def triggering(entries: Sequence[Entry]) -> str:
    """The connection the run came in through ("" : none), from its input step."""
    first = entries[0] if entries else None
    if first is None or first.kind != INPUT:
        return ""
    return str(first.payload.get(TRIGGER_FIELD) or "")


def account_of(connections: Mapping[str, str], tool: Tool, trigger: str) -> str:
    """The connection the tool acts as ("": the default account). ToolCallRejected (nothing is
    sent) when it is the triggering account and the run came in through no connection, or a
    registry tool's connection is named nowhere."""
    if tool.connection is not None:  # a registry tool: its definition names the connection
        return _registry_account(connections, tool, trigger)
    named = connections.get(tool.provider, "")
    if named != TRIGGER:
        return named
    if not trigger:
        raise ToolCallRejected(
            f"{tool.name} acts as the run's triggering account (connections[{tool.provider}] "
            f'is "{TRIGGER}"), but this run came in through no connection: nothing was sent'
        )
    return trigger


def _registry_account(connections: Mapping[str, str], tool: Tool, trigger: str) -> str:
    wanted = tool.connection or ""
    named = connections.get(wanted, "") if wanted and wanted != TRIGGER else wanted
    if named == TRIGGER and not trigger:
        raise ToolCallRejected(
            f"{tool.name} acts as the run's triggering account, but this run came in "
            "through no connection: nothing was sent"
        )
    if named == TRIGGER:
        return trigger
    if wanted and not named:
        raise ToolCallRejected(
            f"{tool.name} needs a {wanted!r} connection and the agent version names none "
            f"(spec.connections[{wanted}]): nothing was sent"
        )
    return named


def for_tool(
    connections: Mapping[str, str], tool: Tool, fetch: FetchToken | None, trigger: str = ""
) -> Credential | None:
    """The credential for the tool's provider; None: the unauthenticated default account."""
    connection_id = account_of(connections, tool, trigger)
    if not connection_id or fetch is None:
        return None
    return Credential(connection_id, fetch, required_scope(tool))


def park_step(
    seq: int, exc: ConnectionUnusable, call_seq: int | None, epoch: int
) -> executor_pb2.NewStep:
    """The park on a connection. With `call_seq`, it records that call as never sent under
    lease `epoch`, so it goes out on resume whatever its class (None: it may have left under
    an earlier lease; resolved by its class then). See executor/steps.py's known_unsent."""
    payload: dict[str, object] = {
        "wait_reason": WAIT_REASON,
        "note": str(exc),
        "connection_id": exc.connection_id,
    }
    if call_seq is not None:
        payload |= steps.unsent_mark(call_seq, epoch)
    return steps.new_step(seq, PARK, payload)
