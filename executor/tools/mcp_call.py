"""Calls one tool of a remote MCP server (streamable HTTP) and classifies what can go wrong.

A call is a short MCP session: the client negotiates the protocol (discover or
initialize), lists the tools, then sends `tools/call`. Until `tools/call` is
on its way nothing can have happened at the server, so every failure before
it is `NotSent`. After it, the failure classes are those of an HTTP tool
(executor/tools/http_tool.py), so the same delivery rules apply:

* ``NotSent`` — the connection for `tools/call` could not be opened;
* ``MaybeSent`` — `tools/call` was (partly) written and no answer came back:
  a timeout, a reset, a connection closed without a result;
* ``ProviderError`` — the server answered, but not with a result: an HTTP
  error status (its status: 429 and 5xx may succeed later), a JSON-RPC error
  (400; internal errors as 502, they may have been applied), or a result
  with ``isError`` (the tool ran and failed: 422, the model reads why).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import httpcore2
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, INTERNAL_ERROR, REQUEST_TIMEOUT, CallToolResult

from executor import horizon, storable
from executor.retry_after import retry_after
from executor.tools.send_errors import Blocked, MaybeSent, NotSent, ProviderError, ToolSendError
from ground import netguard

if TYPE_CHECKING:
    from executor.tools.catalogue import Tool
    from executor.tools.credentials import Credential

# The SDK's HTTP client logs every request at INFO: a call's URL is no news in a log line.
logging.getLogger("httpx2").setLevel(logging.WARNING)
# Its transport logs a body it cannot read with the body quoted, and a server's answer has no
# place in a log line (it may echo the call's Authorization header); the call's outcome says
# what went wrong.
logging.getLogger("mcp.client.streamable_http").setLevel(logging.CRITICAL)

# The platform's patience when a caller gives none (the executor passes the tool's own
# `mcp.timeout_seconds`, else ExecutorConfig.tool_timeout_seconds).
DEFAULT_TIMEOUT_SECONDS = 30.0
# The server answered tools/list without this tool: nothing was called (a pinned version
# of a tool the server has since dropped).
NOT_OFFERED_STATUS = 404
# The tool ran and reported failure (MCP `isError`): the model reads the message.
TOOL_ERROR_STATUS = 422
_CONNECT_ERRORS = (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout)


@dataclass
class _Progress:
    """How far a call got: whether `tools/call` went out, and the HTTP status of its answer."""

    calling: bool = False
    status: int | None = None
    retry_after: float | None = None
    errors: list[BaseException] = field(default_factory=list)


async def call(
    tool: Tool,
    arguments: Mapping[str, Any],
    idempotency_key: str,
    credential: Credential | None = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,  # noqa: ASYNC109
) -> Any:
    """The executor's MCP transport (executor/tools/transport.py): call a registry tool's
    `mcp` target. A provider_key write carries the call's key in the argument the server
    dedupes on (`mcp.key_argument`), so a resend lands once; the connection's token goes on
    the Authorization header of this call's requests only (fetched now: the freshest)."""
    target = tool.mcp
    if target is None:
        raise NotSent(f"tool {tool.name!r} has no MCP target")
    sent = dict(arguments)
    if tool.idempotency == "provider_key" and target.key_argument:
        sent[target.key_argument] = idempotency_key
    headers = {"Authorization": await credential.header()} if credential is not None else {}
    try:
        return await call_mcp(target.url, target.tool, sent, headers=headers, timeout=timeout)
    except ProviderError as exc:
        if credential is not None and exc.status in (401, 403):
            from executor.tools.credentials import ConnectionUnusable

            raise ConnectionUnusable(
                credential.connection_id, "was refused by the MCP server"
            ) from exc
        raise


async def call_mcp(
    target_url: str,
    tool_name: str,
    arguments: Mapping[str, Any],
    *,
    headers: Mapping[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,  # noqa: ASYNC109 (the whole session's deadline)
) -> Any:
    """Call `tool_name` on the MCP server at `target_url`; its result, or a ToolSendError.

    The result is the tool's structured content when it has one, else its
    text (parsed as JSON when it is JSON), else its content blocks.
    `headers` (such as a connection's Authorization) go on every request of
    the session and nowhere else.
    """
    progress = _Progress()
    try:
        with anyio.fail_after(timeout):
            result = await _session_call(target_url, tool_name, dict(arguments), headers, progress)
    except Exception as exc:  # noqa: BLE001 - the SDK's failures arrive in exception groups
        leaf = _leaf(exc)
        if isinstance(leaf, horizon.Refused):  # held back on our side: not the server's doing
            raise leaf from None
        raise _classify(progress, leaf, timeout) from exc
    return _result(result)


async def _session_call(
    url: str,
    tool: str,
    arguments: dict[str, Any],
    headers: Mapping[str, str] | None,
    progress: _Progress,
) -> CallToolResult:
    async def on_response(response: httpx2.Response) -> None:
        if response.status_code >= 400:
            progress.status = response.status_code
            progress.retry_after = retry_after(response.headers)

    http = httpx2.AsyncClient(
        headers=dict(headers or {}),
        timeout=httpx2.Timeout(None),  # the whole call is bounded by `timeout`
        event_hooks={"response": [on_response]},
        # The server's URL is a workspace's data: only to addresses tools may reach.
        transport=netguard.guard(httpx2.AsyncHTTPTransport(), httpcore2.ConnectError),
    )
    async with http, Client(streamable_http_client(url, http_client=http), cache=None) as client:
        listed = await client.list_tools()  # the server's schemas, for the checks of its result
        if all(t.name != tool for t in listed.tools) and listed.next_cursor is None:
            raise ProviderError(
                NOT_OFFERED_STATUS,
                f"the MCP server no longer offers the tool {tool!r}: nothing was called",
            )
        # The run's last-moment check (executor/horizon.py), as for an HTTP tool: after
        # the session's set-up, right before the one request that acts.
        if (refusal := horizon.blocked_now()) is not None:
            raise horizon.Refused(f"not sent: {refusal}")
        progress.calling, progress.status = True, None
        return await client.call_tool(tool, arguments)


def _result(result: CallToolResult) -> Any:
    if result.is_error:
        raise ProviderError(TOOL_ERROR_STATUS, _text(result) or "the tool reported an error")
    if result.structured_content is not None:
        return result.structured_content
    text = _text(result)
    if text is not None and len(result.content) == 1:
        try:
            return storable.parse(text)
        except ValueError:
            return text
    return [block.model_dump(mode="json", by_alias=True) for block in result.content]


def _text(result: CallToolResult) -> str | None:
    texts = [getattr(block, "text", None) for block in result.content]
    joined = "\n".join(t for t in texts if isinstance(t, str))
    return joined[:2000] or None


def _classify(progress: _Progress, exc: BaseException, timeout: float) -> ToolSendError:
    """Which ToolSendError a failed call is, by how far it got (see the module docstring)."""
    if isinstance(exc, ToolSendError):
        return exc
    if isinstance(exc, netguard.DestinationRefused):
        return Blocked(str(exc))
    status = progress.status
    if not progress.calling:
        if status in (401, 403):  # the server refused our credentials: nothing was called
            return ProviderError(status, "the MCP server refused the credentials")
        return NotSent(f"MCP session failed before the call: {_describe(exc, timeout)}")
    if isinstance(exc, _CONNECT_ERRORS):
        return NotSent(f"could not connect to the MCP server: {type(exc).__name__}")
    if status is not None:  # the HTTP answer says more than the SDK's stand-in error
        message = exc.message if isinstance(exc, MCPError) else type(exc).__name__
        return ProviderError(status, message, progress.retry_after)
    if isinstance(exc, MCPError) and exc.code not in (CONNECTION_CLOSED, REQUEST_TIMEOUT):
        # The server's own JSON-RPC error; an internal one may have been applied.
        return ProviderError(502 if exc.code == INTERNAL_ERROR else 400, exc.message)
    return MaybeSent(f"no result from the MCP server: {_describe(exc, timeout)}")


def _describe(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:g}s"
    if isinstance(exc, MCPError):
        return exc.message
    return type(exc).__name__


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside (possibly nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc
