"""The tool HTTP client with rate limits: a token before every request, a 429 becomes a park."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from executor.config import ExecutorConfig
from executor.ratelimit.limiter import RateLimited, RateLimiter
from executor.tools.catalogue import Tool
from executor.tools.http_tool import HttpToolClient
from executor.tools.send_errors import NotSent, ProviderError, ToolSendError

if TYPE_CHECKING:
    from executor.tools.credentials import Credential

# Keys whose write request went out, kept long enough to outlive one delivery.
REMEMBERED_KEYS = 10_000


class RateLimitedToolClient(HttpToolClient):
    """Every request to a provider (a send, a retry, a lookup) takes a token first.

    Both ways out raise RateLimited, which is none of the send errors the
    delivery retries on: nothing is retried here, and the run parks. The
    exception says whether a write with the same key went out earlier (a send
    that may have been applied, then a lookup that found no token): such a
    call is not "never sent", and resumes by its class.
    """

    def __init__(
        self,
        config: ExecutorConfig,
        limiter: RateLimiter,
    ) -> None:
        super().__init__(config)
        self._limiter = limiter
        self._went_out: OrderedDict[str, None] = OrderedDict()

    async def send(
        self,
        tool: Tool,
        arguments: Mapping[str, Any],
        idempotency_key: str,
        credential: Credential | None = None,
    ) -> Any:
        def request() -> Awaitable[Any]:
            return HttpToolClient.send(self, tool, arguments, idempotency_key, credential)

        return await self._limited(
            tool, idempotency_key, request, write=True, credential=credential
        )

    async def look_up(
        self, tool: Tool, idempotency_key: str, credential: Credential | None = None
    ) -> Any | None:
        def request() -> Awaitable[Any]:
            return HttpToolClient.look_up(self, tool, idempotency_key, credential)

        return await self._limited(
            tool, idempotency_key, request, write=False, credential=credential
        )

    async def _limited(
        self,
        tool: Tool,
        key: str,
        request: Callable[[], Awaitable[Any]],
        *,
        write: bool,
        credential: Credential | None = None,
    ) -> Any:
        # The bucket is the real connection's (the shared default without one).
        connection_id = credential.connection_id if credential is not None else None
        try:
            await self._limiter.admit(tool, connection_id)
        except RateLimited as limited:
            raise limited.after_send_if(key in self._went_out) from None
        try:
            result = await request()
        except ProviderError as exc:
            if exc.status == 429:  # refused before it was applied: the provider did nothing
                throttled = await self._limiter.throttled(tool, exc.retry_after, connection_id)
                raise throttled.after_send_if(key in self._went_out) from exc
            self._remember(key, write)
            raise
        except NotSent:
            raise
        except ToolSendError:
            self._remember(key, write)
            raise
        self._remember(key, write)
        return result

    def _remember(self, key: str, write: bool) -> None:
        if not write:
            return
        self._went_out[key] = None
        self._went_out.move_to_end(key)
        while len(self._went_out) > REMEMBERED_KEYS:
            self._went_out.popitem(last=False)
