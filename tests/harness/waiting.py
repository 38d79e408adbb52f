"""Wait for a condition with a deadline, the only way tests synchronise with other processes.

await eventually(lambda: run_status(run_id), message="run finished")
await eventually(check_log)           # a function that asserts: retried until it passes
eventually_sync(lambda: path.exists())
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

DEFAULT_TIMEOUT = 15.0
DEFAULT_INTERVAL = 0.05


async def eventually(
    condition: Callable[[], Any],
    *,
    timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109 (the deadline is what this function is)
    interval: float = DEFAULT_INTERVAL,
    message: str | None = None,
    retry_on: tuple[type[BaseException], ...] = (AssertionError,),
) -> Any:
    """Call `condition` (awaiting its result if awaitable) until it returns a truthy value.

    Returns that value. An exception listed in `retry_on` counts as "not yet" (so a function
    full of asserts works as a condition); any other exception fails at once. At the deadline,
    raises AssertionError carrying `message` and the last value or exception.
    """
    deadline = time.monotonic() + timeout
    while True:
        outcome: Any = None
        try:
            outcome = condition()
            if inspect.isawaitable(outcome):
                outcome = await outcome
            if outcome:
                return outcome
        except retry_on as exc:
            outcome = exc
        if time.monotonic() >= deadline:
            raise _timed_out(condition, timeout, message, outcome)
        await asyncio.sleep(interval)


def eventually_sync(
    condition: Callable[[], Any],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = DEFAULT_INTERVAL,
    message: str | None = None,
    retry_on: tuple[type[BaseException], ...] = (AssertionError,),
) -> Any:
    """The blocking twin of `eventually`, for synchronous code and tests."""
    deadline = time.monotonic() + timeout
    while True:
        outcome: Any = None
        try:
            outcome = condition()
            if outcome:
                return outcome
        except retry_on as exc:
            outcome = exc
        if time.monotonic() >= deadline:
            raise _timed_out(condition, timeout, message, outcome)
        time.sleep(interval)


def _timed_out(
    condition: Callable[[], Any], timeout: float, message: str | None, outcome: Any
) -> AssertionError:
    what = message or getattr(condition, "__qualname__", repr(condition))
    last = (
        f"{type(outcome).__name__}: {outcome}"
        if isinstance(outcome, BaseException)
        else repr(outcome)
    )
    error = AssertionError(f"{what}: not true within {timeout:g}s (last: {last})")
    if isinstance(outcome, BaseException):
        error.__cause__ = outcome
    return error
