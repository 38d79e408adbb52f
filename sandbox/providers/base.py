"""What a fake tool provider is: a name, endpoints, side effects tests can count, and reset."""

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.responses import Response

from sandbox.json_http import JSONResponse

IDEMPOTENCY_HEADER = "idempotency-key"


class Processing:
    """How long the provider works on one request (a `delay` fault sets it).

    A provider awaits `ProviderRequest.work()` where its real counterpart
    would spend the time, typically before its side effect, so that a slow
    request is visibly in flight (a payments key stays "in use"). The app
    waits out whatever a handler did not, so every provider honours delays.
    """

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    async def wait(self) -> None:
        delay, self.delay = self.delay, 0.0
        if delay > 0:
            await asyncio.sleep(delay)


@dataclass(frozen=True)
class ProviderRequest:
    """One call as a provider sees it: the body already parsed (None if not JSON)."""

    method: str
    path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]
    body: Any
    processing: Processing = field(default_factory=Processing)

    @property
    def idempotency_key(self) -> str | None:
        return self.headers.get(IDEMPOTENCY_HEADER)

    async def work(self) -> None:
        """Spend the processing time this request was given (none unless a fault says so)."""
        await self.processing.wait()


Handler = Callable[[ProviderRequest], Response | Awaitable[Response]]


@dataclass(frozen=True)
class Endpoint:
    """A route of a provider. `recorded=False` marks inspection routes for tests
    (such as the sent-mail list): they are neither logged nor subject to faults."""

    method: str
    path: str
    handler: Handler
    recorded: bool = True


class Provider(Protocol):
    """A provider module's class; the app builds one instance per app.

    A provider may also define `effects() -> list[dict]`: every side effect it
    performed, each with the `key` of the request that caused it, so tests can
    count duplicates (`GET /_sandbox/effects`).
    """

    name: str

    def endpoints(self) -> list[Endpoint]: ...

    def reset(self) -> None:
        """Forget side effects (sent mail, upserts); called when the request log is cleared."""


def error(status: int, message: str, code: str | None = None) -> JSONResponse:
    """An error answer; with `code`, shaped as Stripe's (`{"error": {"code", "message"}}`)."""
    if code is None:
        return JSONResponse({"error": message}, status_code=status)
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def missing_string_field(body: Any, fields: tuple[str, ...]) -> str | None:
    """The first of `fields` that the JSON body lacks as a string, or a note that
    the body is not an object; None when every field is there."""
    if not isinstance(body, dict):
        return "body must be a JSON object"
    for name in fields:
        if not isinstance(body.get(name), str):
            return f"missing field: {name}" if name not in body else f"{name} must be a string"
    return None


def wrong_optional_strings(body: dict[str, Any], fields: tuple[str, ...]) -> str | None:
    """The first of the optional `fields` present in the body but not a string."""
    for name in fields:
        if name in body and not isinstance(body[name], str):
            return f"{name} must be a string"
    return None
