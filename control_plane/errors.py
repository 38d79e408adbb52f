"""Domain errors that carry their gRPC status, and the interceptor that maps them.

Servicers raise these; they never call `context.abort` themselves. Anything
else becomes INTERNAL with a request id, the details only in the log.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import grpc

from control_plane.store.errors import DatabaseUnavailable

log = logging.getLogger(__name__)


class DomainError(Exception):
    code = grpc.StatusCode.UNKNOWN


class InvalidArgument(DomainError):
    """A request field is missing, malformed or out of range; `field` names it."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


class NotFound(DomainError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(DomainError):
    code = grpc.StatusCode.ALREADY_EXISTS


class Aborted(DomainError):
    code = grpc.StatusCode.ABORTED


class PermissionDenied(DomainError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(DomainError):
    """No credential, or one that is malformed, unknown, revoked or expired."""

    code = grpc.StatusCode.UNAUTHENTICATED


class FailedPrecondition(DomainError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(DomainError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


_UNAVAILABLE = (
    DatabaseUnavailable,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.InterfaceError,
    ConnectionError,
    OSError,
)


_TRANSIENT = (
    *_UNAVAILABLE,
    asyncpg.exceptions.PostgresConnectionError,  # class 08: the connection broke
    asyncpg.exceptions.OperatorInterventionError,  # class 57: shutting down, restarting
    asyncpg.exceptions.InsufficientResourcesError,  # class 53: too many connections, disk full
    TimeoutError,
)


def transient(exc: BaseException) -> bool:
    """The database could not be reached (or is restarting): the same write may be retried
    later and nothing is known to have been written. Anything else is a bug or a refusal."""
    return isinstance(exc, _TRANSIENT)


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status and client-safe message for an exception."""
    if isinstance(exc, DomainError):
        return exc.code, str(exc)
    if isinstance(exc, _UNAVAILABLE):
        return grpc.StatusCode.UNAVAILABLE, "database unavailable, retry later"
    request_id = uuid.uuid4().hex[:12]
    log.exception("internal error (request %s)", request_id)
    return grpc.StatusCode.INTERNAL, f"internal error (request {request_id})"


def _wrap_unary(behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await behavior(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # noqa: BLE001 - this is the one place that maps them
            code, message = status_for(exc)
            await context.abort(code, message)

    return wrapper


def _wrap_stream(behavior: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            async for item in behavior(request, context):
                yield item
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # noqa: BLE001
            code, message = status_for(exc)
            await context.abort(code, message)

    return wrapper


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Maps exceptions raised by unary and server-streaming handlers to statuses."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming:
            return handler
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                _wrap_unary(handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                _wrap_stream(handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler
