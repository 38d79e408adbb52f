"""What can go wrong sending one tool call, by what it means at the provider: the request never
left (NotSent, Blocked), it may have been applied (MaybeSent), the provider answered with an
error (ProviderError), or it answered with success but not with what the tool takes from its
answer (UnusableAnswer). The delivery (delivery.py) settles a call by these classes, whether it
went over HTTP (http_tool.py) or to an MCP server (transport.py, mcp_call.py)."""

from __future__ import annotations


class ToolSendError(Exception):
    """A tool request that did not produce a usable response."""


class NotSent(ToolSendError):
    """The request never left: nothing can have happened at the provider."""


class Blocked(NotSent):
    """The tool's host is one tools may not reach (ground/netguard.py): refused
    before anything left, and sending again would be refused again."""


class MaybeSent(ToolSendError):
    """The request may have reached the provider (timeout or reset after it was written)."""


class ProviderError(ToolSendError):
    """The provider answered with an HTTP error status."""

    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        """429 and 5xx may succeed later; other 4xx will not."""
        return self.status == 429 or self.status >= 500


class UnusableAnswer(ToolSendError):
    """The provider answered with success, but its answer has nothing where the tool's
    definition takes its result (response_pointer): the request was applied, and the same
    request would get the same kind of answer. The message names the pointer, not the answer."""
