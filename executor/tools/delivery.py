"""Sends a tool call under its idempotency class and turns what happened into a tool result."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from executor.tools.catalogue import Tool
from executor.tools.http_tool import HttpToolClient, MaybeSent, NotSent, ProviderError

NOT_RETRIED = "not retried: tool has no idempotency key or lookup"
# Longest Retry-After honoured inline; longer waits are a rate-limit park (later).
MAX_INLINE_RETRY_AFTER = 5.0

Guard = Callable[[], None]


@dataclass(frozen=True)
class Outcome:
    """A tool_result's status and content."""

    status: str  # ok, error or unknown
    output: Any = None
    error: str | None = None
    resolution: str | None = None


def may_resend(call_class: str, exc: BaseException) -> bool:
    """Whether sending the same request again is safe after `exc`, for this class."""
    if isinstance(exc, NotSent):
        return True  # nothing left the executor
    if isinstance(exc, ProviderError) and exc.status == 429:
        return True  # refused before it was applied
    if call_class in ("read", "provider_key"):
        # Reads change nothing; provider_key writes are deduplicated by the key.
        return isinstance(exc, MaybeSent) or (isinstance(exc, ProviderError) and exc.retryable)
    return False


def classify(call_class: str, exc: BaseException, attempts: int) -> Outcome:
    """The result of a send that ended with `exc` after `attempts` tries."""
    tries = f"after {attempts} attempt{'s' if attempts != 1 else ''}"
    if isinstance(exc, NotSent):
        return Outcome("error", error=f"{exc} ({tries}; the request was never sent)")
    if isinstance(exc, ProviderError):
        if exc.status < 500:  # 4xx, incl. 429: the provider refused; nothing happened
            return Outcome("error", error=f"provider returned {exc.status}: {exc.message}")
        if call_class == "read":
            return Outcome("error", error=f"provider returned {exc.status} {tries}: {exc.message}")
    elif call_class == "read":
        return Outcome("error", error=f"{exc} ({tries})")
    # A write that may have been applied: the outcome is unknown, and says why.
    if call_class == "provider_key":
        resolution = f"sent {attempts} times with the same idempotency key, no clear answer ({exc})"
    else:
        resolution = f"{NOT_RETRIED} ({exc})"
    return Outcome("unknown", resolution=resolution)


class ToolDelivery:
    """Sends with retries where the class allows them, checking the lease before every send."""

    def __init__(
        self,
        client: HttpToolClient,
        attempts: int = 4,
        initial_wait: float = 0.2,
        max_wait: float = 2.0,
    ) -> None:
        self._client = client
        self._attempts = attempts
        self._backoff = wait_exponential_jitter(
            multiplier=initial_wait, max=max_wait, jitter=initial_wait
        )

    async def send(
        self, tool: Tool, arguments: Mapping[str, Any], key: str, guard: Guard
    ) -> Outcome:
        """Send the call (first time, or again on resume for read/provider_key)."""
        call_class = tool.call_class
        retrying = AsyncRetrying(
            retry=retry_if_exception(lambda exc: may_resend(call_class, exc)),
            stop=stop_after_attempt(self._attempts),
            wait=self._wait,
            reraise=True,
        )
        attempts = 0
        try:
            async for attempt in retrying:
                with attempt:
                    attempts += 1
                    guard()  # never send under a lease that may have lapsed
                    output = await self._client.send(tool, arguments, key)
        except (NotSent, MaybeSent, ProviderError) as exc:
            return classify(call_class, exc, attempts)
        return Outcome("ok", output=output)

    async def resolve_unknown(
        self,
        tool: Tool,
        recorded_class: str,
        arguments: Mapping[str, Any],
        key: str,
        guard: Guard,
    ) -> Outcome:
        """A started call without a result, found on resume: resolve it by class.

        `recorded_class` is the class written in `tool_started`; the request is
        sent again only if that class and today's catalogue both allow it.
        """
        if recorded_class in ("read", "provider_key") and tool.call_class == recorded_class:
            return await self.send(tool, arguments, key, guard)
        # `lookup` should ask the provider whether the action with this key
        # happened; the lookup endpoint arrives with a later issue, so until
        # then a lookup tool is resolved like `none`: not sent, marked unknown.
        return Outcome("unknown", resolution=NOT_RETRIED)

    def _wait(self, state: RetryCallState) -> float:
        delay = self._backoff(state)
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, ProviderError) and exc.retry_after is not None:
            delay = max(delay, min(exc.retry_after, MAX_INLINE_RETRY_AFTER))
        return delay
