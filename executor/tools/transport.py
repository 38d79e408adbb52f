"""Where a registry tool's call goes: its HTTP template (http_tool.py) or a remote MCP server.

`call_mcp` is the MCP hook: it hands the call to `executor/tools/mcp_call.py`'s
`call(tool, arguments, idempotency_key, credential, timeout) -> Any` (the MCP transport, streamable
HTTP), which raises the same send errors as an HTTP tool (NotSent: nothing left; MaybeSent:
it may have been applied; ProviderError: the server answered with an error), so the
delivery settles MCP writes by their class exactly like HTTP ones. Until that module exists
an MCP call is NotSent: refused before anything left.
"""

from __future__ import annotations

import asyncio
import importlib
import threading
from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

from executor.tools.send_errors import NotSent

if TYPE_CHECKING:
    from executor.tools.catalogue import Tool
    from executor.tools.credentials import Credential

MCP_MODULE = "executor.tools.mcp_call"
# The transport once loaded; the lock makes concurrent first calls wait for the one import
# (a second caller would otherwise find the half-initialised module in sys.modules).
_mcp: dict[str, ModuleType] = {}
_loading = threading.Lock()


async def _load() -> ModuleType:
    """The mcp SDK takes seconds to import: in a thread, so leases keep beating meanwhile."""
    try:
        return await asyncio.to_thread(_import)
    except ModuleNotFoundError as exc:
        if exc.name != MCP_MODULE:
            raise
        raise NotSent("mcp transport not available") from None


def _import() -> ModuleType:
    with _loading:
        if MCP_MODULE not in _mcp:
            _mcp[MCP_MODULE] = importlib.import_module(MCP_MODULE)
        return _mcp[MCP_MODULE]


async def call_mcp(
    tool: Tool,
    arguments: Mapping[str, Any],
    idempotency_key: str,
    credential: Credential | None = None,
    timeout: float = 30.0,  # noqa: ASYNC109
) -> Any:
    """Call `tool.mcp` with these arguments (the key for a provider_key class: the server
    dedupes on `tool.mcp.key_argument`) within `timeout` seconds (the tool's own, else the
    platform's); the tool's result, or a ToolSendError."""
    module = _mcp.get(MCP_MODULE) or await _load()
    return await module.call(tool, arguments, idempotency_key, credential, timeout)
