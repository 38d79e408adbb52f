"""Where a registry tool's call goes: its HTTP template (http_tool.py) or a remote MCP server.

`call_mcp` is the MCP hook: it hands the call to `executor/tools/mcp_call.py`'s
`call(tool, arguments, idempotency_key, credential) -> Any` (the MCP transport, streamable
HTTP), which raises the same send errors as an HTTP tool (NotSent: nothing left; MaybeSent:
it may have been applied; ProviderError: the server answered with an error), so the
delivery settles MCP writes by their class exactly like HTTP ones. Until that module exists
an MCP call is NotSent: refused before anything left.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from executor.tools.http_tool import NotSent

if TYPE_CHECKING:
    from executor.tools.catalogue import Tool
    from executor.tools.credentials import Credential

MCP_MODULE = "executor.tools.mcp_call"


async def call_mcp(
    tool: Tool, arguments: Mapping[str, Any], idempotency_key: str,
    credential: Credential | None = None,
) -> Any:  # fmt: skip
    """Call `tool.mcp` with these arguments (the key for a provider_key class: the server
    dedupes on `tool.mcp.key_argument`); the tool's result, or a ToolSendError."""
    try:
        module = importlib.import_module(MCP_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != MCP_MODULE:
            raise
        raise NotSent("mcp transport not available") from None
    return await module.call(tool, arguments, idempotency_key, credential)
