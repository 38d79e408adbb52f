"""Sends a tool call under its idempotency class and says what the run must record.

`send()` is a call's first request; `resolve_unknown()` settles a call found
started without a result when a run resumes. Both end in an `Outcome`:

* ``ok`` / ``error`` — a `tool_result` the model reads;
* ``unknown`` — the request may or may not have been applied and nothing may
  settle it (class ``none``, or a key its provider has forgotten): the result
  is recorded as unknown and the run waits for a person's decision;
* ``pending`` — not settled yet but settleable (a provider_key write nobody
  answered, a key still in use, a lookup that could not be asked): nothing is
  recorded, the run parks and resolves it again, with the same key, when it
  wakes. After `MAX_PENDING_PARKS` the outcome's `fallback` is recorded.

Every request is preceded by the lease guard, so nothing is sent under a
lease that may have lapsed. What our own side holds back (the guard, the
send horizon, a control plane that cannot be reached) is no outcome at all:
`horizon.Refused` is raised, and the run hands itself back.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tenacity import Future, RetryCallState, wait_exponential_jitter

from executor import horizon
from executor.tools import keys
from executor.tools.catalogue import Tool
from executor.tools.credentials import Credential
from executor.tools.failures import Failure, classify, may_resend
from executor.tools.http_tool import HttpToolClient
from executor.tools.send_errors import Blocked, ProviderError, ToolSendError

NOT_RETRIED = "not retried: tool has no idempotency key or lookup"
ASK_A_PERSON = "waiting for a person to decide whether it happened"
# Longest Retry-After honoured inline; longer waits park the run.
MAX_INLINE_RETRY_AFTER = 5.0
# Parking to settle a pending outcome: backoff, and how often before giving up.
PENDING_BACKOFF_START = 1.0
PENDING_BACKOFF_CAP = 300.0
MAX_PENDING_PARKS = 8

# Raises if the request must not leave; may first wait (the send horizon).
Guard = Callable[[], Awaitable[None] | None]
Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class Outcome:
    """What a send or a resolution came to (see the module docstring)."""

    status: str  # ok, error, unknown or pending
    output: Any = None
    error: str | None = None
    resolution: str | None = None
    retry_after: float | None = None  # pending: the provider asked for this much patience
    fallback: Outcome | None = None  # pending: recorded once the run stops retrying

    @classmethod
    def unknown(cls, why: str) -> Outcome:
        return cls("unknown", resolution=f"{why}; {ASK_A_PERSON}")

    @classmethod
    def pending(cls, why: str, fallback: Outcome, retry_after: float | None = None) -> Outcome:
        return cls("pending", resolution=why, retry_after=retry_after, fallback=fallback)


def after_parks(outcome: Outcome, parks: int) -> Outcome:
    """A pending outcome that has parked `parks` times already gives way to its fallback."""
    if outcome.status == "pending" and parks >= MAX_PENDING_PARKS and outcome.fallback:
        return outcome.fallback
    return outcome


def pending_backoff(parks: int, retry_after: float | None, rng: random.Random) -> float:
    """Seconds to park before resolving a pending outcome again."""
    delay = min(PENDING_BACKOFF_CAP, PENDING_BACKOFF_START * 2**parks)
    delay = rng.uniform(delay / 2, delay)
    if retry_after is not None:
        delay = max(delay, min(retry_after, PENDING_BACKOFF_CAP))
    return round(delay, 3)


@dataclass(frozen=True)
class _Answered:
    output: Any


@dataclass(frozen=True)
class _Failed:
    failure: Failure
    error: ToolSendError
    attempts: int

    @property
    def tries(self) -> str:
        return f"after {self.attempts} attempt{'s' if self.attempts != 1 else ''}"

    @property
    def retry_after(self) -> float | None:
        return self.error.retry_after if isinstance(self.error, ProviderError) else None


_NOT_FOUND = object()


def settle(call_class: str, sent: _Answered | _Failed) -> Outcome:
    """The outcome of a send (with its inline retries done) for a call of this class."""
    if isinstance(sent, _Answered):
        return Outcome("ok", output=sent.output)
    if sent.failure is Failure.NOT_SENT:
        return Outcome("error", error=f"{sent.error} ({sent.tries}; the request was never sent)")
    if sent.failure in (Failure.REFUSED, Failure.RATE_LIMITED):
        error = sent.error
        assert isinstance(error, ProviderError)
        return Outcome("error", error=f"provider returned {error.status}: {error.message}")
    if sent.failure is Failure.UNUSABLE_ANSWER:  # answered and applied: a failed call, told so
        return Outcome("error", error=str(sent.error))
    if sent.failure is Failure.KEY_IN_USE:
        return Outcome.pending(
            f"the key is still in use at the provider ({sent.tries}); retrying it later",
            Outcome.unknown(f"the key stayed in use at the provider ({sent.error})"),
            sent.retry_after,
        )
    return _maybe_applied(call_class, sent)


def _maybe_applied(call_class: str, sent: _Failed) -> Outcome:
    """A request that may have been applied, and got no usable answer."""
    if call_class == "read":
        error = Outcome("error", error=f"{sent.error} ({sent.tries})")
        return Outcome.pending(f"no answer ({sent.error}, {sent.tries})", error, sent.retry_after)
    if call_class == "provider_key":
        why = f"sent {sent.attempts} times with the same idempotency key, no clear answer"
        return Outcome.pending(
            f"{why} ({sent.error}); sending the same key again later",
            Outcome.unknown(f"{why} ({sent.error})"),
            sent.retry_after,
        )
    return Outcome.unknown(f"{NOT_RETRIED} ({sent.error})")


class ToolDelivery:
    """Sends with retries where the class allows them, checking the lease before every send."""

    def __init__(
        self,
        client: HttpToolClient,
        attempts: int = 4,
        initial_wait: float = 0.2,
        max_wait: float = 2.0,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._client = client
        self._attempts = attempts
        self._sleep = sleep
        self._backoff = wait_exponential_jitter(
            multiplier=initial_wait, max=max_wait, jitter=initial_wait
        )

    async def send(
        self,
        tool: Tool,
        arguments: Mapping[str, Any],
        key: str,
        guard: Guard,
        credential: Credential | None = None,
    ) -> Outcome:
        """Send a call for the first time (or again, where its class allows), as the
        connected account of `credential` (None: the provider's unauthenticated default)."""
        call_class = tool.call_class
        if call_class == "lookup":
            return await self._send_and_look_up(tool, arguments, key, guard, credential)
        sent = await self._attempt(
            call_class, lambda: self._client.send(tool, arguments, key, credential), guard
        )
        return settle(call_class, sent)

    async def resolve_unknown(
        self,
        tool: Tool | None,
        recorded_class: str,
        arguments: Mapping[str, Any],
        key: str,
        guard: Guard,
        key_age: float = 0.0,
        credential: Credential | None = None,
    ) -> Outcome:
        """A started call without a result, found on resume: resolve it by class.

        `recorded_class` is the class written in `tool_started`; it counts only
        while today's catalogue agrees and the provider still remembers the key
        (`keys.resolution_class`), else the call is resolved as `none`.
        """
        resolved = keys.resolution_class(tool, recorded_class, key_age)
        if resolved.downgraded_because or tool is None:
            return Outcome.unknown(f"not retried: {resolved.downgraded_because}")
        if resolved.name in ("read", "provider_key"):
            return await self.send(tool, arguments, key, guard, credential)
        if resolved.name == "lookup":
            found = await self._look_up(tool, key, guard, credential)
            if found is not _NOT_FOUND:
                return found
            return await self._send_and_look_up(tool, arguments, key, guard, credential)
        return Outcome.unknown(NOT_RETRIED)

    async def _send_and_look_up(
        self,
        tool: Tool,
        arguments: Mapping[str, Any],
        key: str,
        guard: Guard,
        credential: Credential | None = None,
    ) -> Outcome:
        """Lookup class: a send that may have been applied is followed by a lookup,
        and sent again (same key) only when the provider says it has not got it."""
        assert tool.lookup is not None
        for tried in range(self._attempts):
            sent = await self._attempt(
                "lookup",
                lambda: self._client.send(tool, arguments, key, credential),
                guard,
                exposed=tried > 0,
            )
            if not (isinstance(sent, _Failed) and sent.failure is Failure.MAYBE_APPLIED):
                return settle("lookup", sent)
            # Let a request that timed out finish at the provider before asking.
            await self._sleep(tool.lookup.settle_seconds)
            found = await self._look_up(tool, key, guard, credential, exposed=True)
            if found is not _NOT_FOUND:
                return found
        why = f"sent {self._attempts} times, never answered, and each lookup found nothing"
        return Outcome.pending(f"{why}; asking again later", Outcome.unknown(why))

    async def _look_up(
        self,
        tool: Tool,
        key: str,
        guard: Guard,
        credential: Credential | None = None,
        exposed: bool = False,
    ) -> Any:
        """The outcome if the provider has the action with this key, else _NOT_FOUND
        (`exposed`: the call may have been sent before, as _attempt says)."""
        looked = await self._attempt(
            "read", lambda: self._client.look_up(tool, key, credential), guard, exposed
        )
        if isinstance(looked, _Failed):
            why = f"could not ask {tool.provider} whether it happened ({looked.error})"
            return Outcome.pending(why, Outcome.unknown(why), looked.retry_after)
        if looked.output is None:
            return _NOT_FOUND
        resolution = f"the response was lost; a lookup by key found it at {tool.provider}"
        return Outcome("ok", output=looked.output, resolution=resolution)

    async def _attempt(
        self,
        call_class: str,
        request: Callable[[], Awaitable[Any]],
        guard: Guard,
        exposed: bool = False,
    ) -> _Answered | _Failed:
        """One request, repeated (same key) while its failures allow it, up to `attempts`.

        A refusal on our own side (horizon.Refused: the guard, the last-moment check, a
        token the control plane could not give) is never settled as the call's outcome: it
        is raised for the run to hand itself back, saying whether an earlier request of the
        call may have reached the provider (`exposed`: one already had before this)."""
        # A plain loop, not tenacity's AsyncRetrying: setting one up and stepping through
        # it was about 5 % of the executor's CPU in issue 16's profiles, for a first try
        # that nearly always answers. The waits are tenacity's still (self._wait).
        attempts = 0
        while True:
            attempts += 1
            try:
                # Never send under a lease that may have lapsed, or past the horizon.
                if (waiting := guard()) is not None:
                    await waiting
            except horizon.Refused as exc:
                raise exc.after(exposed) from None
            try:
                return _Answered(await request())
            except horizon.Refused as exc:
                # Nothing of it left; the guard decides whether the next try may go.
                if attempts >= self._attempts:
                    raise exc.after(exposed) from None
            except ToolSendError as exc:
                failure = classify(exc, call_class)
                if attempts >= self._attempts or not _resent(exc, call_class, failure):
                    return _Failed(failure, exc, attempts)
                exposed = exposed or failure not in (Failure.NOT_SENT, Failure.RATE_LIMITED)
                await self._sleep(self._wait(_after_attempt(attempts, exc)))
                continue
            await self._sleep(self._wait(_after_attempt(attempts, None)))

    def _wait(self, state: RetryCallState) -> float:
        delay = self._backoff(state)
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, ProviderError) and exc.retry_after is not None:
            delay = max(delay, min(exc.retry_after, MAX_INLINE_RETRY_AFTER))
        return delay


def _resent(exc: ToolSendError, call_class: str, failure: Failure) -> bool:
    """Whether the very same request goes out again now, after it failed so."""
    if isinstance(exc, Blocked):  # refused by policy: it would be refused again
        return False
    return may_resend(call_class, failure)


def _after_attempt(number: int, exc: BaseException | None) -> RetryCallState:
    """The state tenacity hands a wait strategy after attempt `number` raised `exc` (None:
    held back on our side)."""
    state = RetryCallState(None, None, (), {})  # type: ignore[arg-type]
    state.attempt_number = number
    state.outcome = Future.construct(number, exc, exc is not None)
    return state
