"""Domain errors as HTTP answers, in one place (the HTTP twin of control_plane.ground.errors).

Route handlers raise the same DomainError subclasses the gRPC servicers do;
`json_errors` turns them into a JSON body `{"error", "code"}` with the status
below. Anything else is a 500 with a request id, details only in the log.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable

import grpc
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from control_plane.ground.errors import DomainError, status_for

log = logging.getLogger(__name__)

HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
}

Handler = Callable[[Request], Awaitable[Response]]


def error(status: int, message: str, code: str = "") -> JSONResponse:
    body = {"error": message}
    if code:
        body["code"] = code
    return JSONResponse(body, status_code=status)


def json_errors(handler: Handler) -> Handler:
    """Wrap a route handler so domain errors become their HTTP status."""

    @functools.wraps(handler)
    async def wrapper(request: Request) -> Response:
        try:
            return await handler(request)
        except DomainError as exc:
            return error(HTTP_STATUS.get(exc.code, 500), str(exc), exc.code.name)
        except Exception as exc:  # noqa: BLE001 - the one place HTTP failures are mapped
            code, message = status_for(exc)  # logs unknown errors with a request id
            if code == grpc.StatusCode.INTERNAL:
                return error(500, message, code.name)
            return error(HTTP_STATUS.get(code, 500), message, code.name)

    return wrapper
