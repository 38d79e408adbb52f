"""Errors of the HTTP/JSON API as RFC 9457 problem details (`application/problem+json`).

`{"type", "title", "status", "detail", "code", "field"}`: the status is the one the gRPC
code maps to (control_plane/http/errors.py's HTTP_STATUS), `code` the gRPC code's name and
`field` (400 only) the field at fault as the HTTP API names it (`payload`, not
`payload_json`). A failure that is not the caller's is a 500 with a request id, the details
only in the log, as over gRPC.
"""

from __future__ import annotations

import functools
from typing import Any

import grpc
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from control_plane.ground.errors import DomainError, InvalidArgument, status_for
from control_plane.http.errors import HTTP_STATUS, Handler
from control_plane.http.jsonmap import http_field

MEDIA_TYPE = "application/problem+json"
TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Content Too Large",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def problem(
    status: int, detail: str, code: str = "", field: str = "", headers: dict[str, str] | None = None
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
    }
    if code:
        body["code"] = code
    if field:
        body["field"] = field
    return JSONResponse(body, status_code=status, media_type=MEDIA_TYPE, headers=headers)


def from_exception(exc: BaseException) -> JSONResponse:
    """The problem an exception is (status_for logs what is not the caller's)."""
    code, message = status_for(exc)
    status = HTTP_STATUS.get(code, 500)
    field = ""
    if isinstance(exc, InvalidArgument):
        field = http_field(exc.field)
        message = message.replace(exc.field, field, 1)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return problem(status, message, code.name, headers={"WWW-Authenticate": "Bearer"})
    return problem(status, message, code.name, field)


def problem_errors(handler: Handler) -> Handler:
    """Wrap a route handler so every error it raises is a problem-details answer."""

    @functools.wraps(handler)
    async def wrapper(request: Request) -> Response:
        try:
            return await handler(request)
        except DomainError as exc:
            return from_exception(exc)
        except Exception as exc:  # noqa: BLE001 - the one place API failures are mapped
            return from_exception(exc)

    return wrapper
