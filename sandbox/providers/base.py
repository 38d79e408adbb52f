"""What a fake tool provider is: a name, endpoints, and state that tests can reset."""

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.responses import JSONResponse, Response

IDEMPOTENCY_HEADER = "idempotency-key"


@dataclass(frozen=True)
class ProviderRequest:
    """One call as a provider sees it: the body already parsed (None if not JSON)."""

    method: str
    path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]
    body: Any

    @property
    def idempotency_key(self) -> str | None:
        return self.headers.get(IDEMPOTENCY_HEADER)


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
    """A provider module's class; the app builds one instance per app."""

    name: str

    def endpoints(self) -> list[Endpoint]: ...

    def reset(self) -> None:
        """Forget side effects (sent mail, upserts); called when the request log is cleared."""


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def missing_string_field(body: Any, fields: tuple[str, ...]) -> str | None:
    """The first of `fields` that the JSON body lacks as a string, or a note that
    the body is not an object; None when every field is there."""
    if not isinstance(body, dict):
        return "body must be a JSON object"
    for field in fields:
        if not isinstance(body.get(field), str):
            return f"missing field: {field}" if field not in body else f"{field} must be a string"
    return None
