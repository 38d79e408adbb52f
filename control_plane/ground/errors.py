"""Domain errors that carry their gRPC status, and the interceptor that maps them.

Servicers raise these; they never call `context.abort` themselves. Anything
else becomes INTERNAL with a request id, the details only in the log.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from control_plane.ground.decoding import Refused, guard_decoder, takes_refused
from control_plane.store.errors import DataRefused, unavailable

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


class RequestRefused(DomainError):
    """A request that did not decode (decoding.Refused), refused once its caller's credential
    was checked (control_plane/auth/interceptor.py)."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, refused: Refused) -> None:
        super().__init__(refused.problem)
        self.refused = refused


# A status message travels as a trailer, and clients refuse trailers over 16 KiB (the
# whole call then fails with a transport error): no message may quote that much input.
MAX_DETAILS = 2_000


def bounded(message: str) -> str:
    """`message`, cut to MAX_DETAILS characters with a mark saying so."""
    return message if len(message) <= MAX_DETAILS else message[:MAX_DETAILS] + "… (cut)"


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status and client-safe message for an exception."""
    if isinstance(exc, DomainError):
        return exc.code, bounded(str(exc))
    if unavailable(exc):
        return grpc.StatusCode.UNAVAILABLE, "database unavailable, retry later"
    if isinstance(exc, DataRefused):
        # A value of the caller's that Postgres will not store or compare (a NUL in text,
        # a number out of range) and that no check before it caught: theirs to fix.
        log.info("refused: %s", bounded(str(exc)))
        return grpc.StatusCode.INVALID_ARGUMENT, bounded(str(exc))
    request_id = uuid.uuid4().hex[:12]
    log.exception("internal error (request %s)", request_id)
    return grpc.StatusCode.INTERNAL, f"internal error (request {request_id})"


def _refuse(method: str, refused: Refused) -> tuple[grpc.StatusCode, str]:
    """One log line, no traceback: a refused request is the caller's problem, not ours."""
    problem = bounded(refused.problem)
    log.info("refused %s: %s", method, problem)
    return grpc.StatusCode.INVALID_ARGUMENT, problem


def _wrap_unary(
    behavior: Callable[..., Awaitable[Any]], method: str
) -> Callable[..., Awaitable[Any]]:
    refuses_itself = takes_refused(behavior)

    async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Refused) and not refuses_itself:
            await context.abort(*_refuse(method, request))
        try:
            return await behavior(request, context)
        except grpc.aio.AbortError:
            raise
        except RequestRefused as exc:
            await context.abort(*_refuse(method, exc.refused))
        except Exception as exc:  # noqa: BLE001 - this is the one place that maps them
            code, message = status_for(exc)
            await context.abort(code, message)

    return wrapper


def _wrap_stream(
    behavior: Callable[..., AsyncIterator[Any]], method: str
) -> Callable[..., AsyncIterator[Any]]:
    refuses_itself = takes_refused(behavior)

    async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        if isinstance(request, Refused) and not refuses_itself:
            await context.abort(*_refuse(method, request))
        try:
            async for item in behavior(request, context):
                yield item
        except grpc.aio.AbortError:
            raise
        except RequestRefused as exc:
            await context.abort(*_refuse(method, exc.refused))
        except Exception as exc:  # noqa: BLE001
            code, message = status_for(exc)
            await context.abort(code, message)

    return wrapper


def _wrap_bidi(
    behavior: Callable[..., AsyncIterator[Any]], method: str
) -> Callable[..., AsyncIterator[Any]]:
    """A refused item ends the request stream; the handler winds down, then the call ends
    INVALID_ARGUMENT naming the message (other calls are not affected)."""

    async def wrapper(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        refused: list[Refused] = []

        async def checked() -> AsyncIterator[Any]:
            async for request in requests:
                if isinstance(request, Refused):
                    refused.append(request)
                    return
                yield request

        async for item in _wrap_stream(behavior, method)(checked(), context):
            yield item
        if refused:
            await context.abort(*_refuse(method, refused[0]))

    return wrapper


# Stream items the handler answers one by one check their own NULs: a Commit holding one
# is that run's COMMIT_OUTCOME_INVALID (dispatch/session.py), not the end of the stream.
PER_ITEM_FIELDS = frozenset({"commit", "commits"})


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Decodes every request without raising (control_plane.ground.decoding), refuses the
    undecodable and NUL-bearing ones with INVALID_ARGUMENT, and maps exceptions raised by
    handlers to statuses: unary, server-streaming and bidi alike."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(
                _wrap_bidi(handler.stream_stream, method),
                request_deserializer=guard_decoder(handler.request_deserializer, PER_ITEM_FIELDS),
                response_serializer=handler.response_serializer,
            )
        decoder = guard_decoder(handler.request_deserializer)
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                _wrap_unary(handler.unary_unary, method),
                request_deserializer=decoder,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                _wrap_stream(handler.unary_stream, method),
                request_deserializer=decoder,
                response_serializer=handler.response_serializer,
            )
        return handler
