"""Trace context on unary RPCs: the caller's interceptor sends its span's `traceparent` as
metadata, the server's continues it in a SERVER span per call.

The executor's stream carries context per message instead (each Commit's `traceparent`:
telemetry/tracing.py); these interceptors are for the unary calls beside it (payload
chunks and slices, connection tokens) and for every unary call a client makes to the
control plane. A call that arrives with no context starts a root span: a request is work.
Health checks and reflection are not traced: load balancers poll them, and an idle
process exports no span (docs/operations.md, "Traces").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from opentelemetry.trace import SpanKind

from telemetry import tracing

TRACEPARENT = "traceparent"
# Polled, not requested: never traced.
_UNTRACED = ("/grpc.health.v1.Health/", "/grpc.reflection.")
_tracer = tracing.tracer(__name__)


class ClientTracing(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Adds the current span's `traceparent` to each unary call's metadata."""

    async def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[Any]],
        client_call_details: grpc.aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        parent = tracing.current()
        if parent:
            metadata = grpc.aio.Metadata(*(client_call_details.metadata or ()))
            metadata.add(TRACEPARENT, parent)
            client_call_details = grpc.aio.ClientCallDetails(
                client_call_details.method,
                client_call_details.timeout,
                metadata,
                client_call_details.credentials,
                client_call_details.wait_for_ready,
            )
        return await continuation(client_call_details, request)


def client_interceptors() -> list[grpc.aio.ClientInterceptor]:
    """The interceptors a channel takes: none when this process exports no spans."""
    return [ClientTracing()] if tracing.on() else []


class ServerTracing(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """A SERVER span per unary call (streams are traced per message by their handlers),
    continuing the caller's `traceparent` when it sent one."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if (
            handler is None
            or handler.unary_unary is None
            or not tracing.on()
            or method.startswith(_UNTRACED)
        ):
            return handler
        sent = dict(handler_call_details.invocation_metadata or ()).get(TRACEPARENT, "")
        return grpc.unary_unary_rpc_method_handler(
            _traced(handler.unary_unary, method, sent if isinstance(sent, str) else ""),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def _traced(
    inner: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]], method: str, parent: str
) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    service, _, name = method.lstrip("/").rpartition("/")
    attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}

    async def traced(request: Any, context: grpc.aio.ServicerContext) -> Any:
        with _tracer.start_as_current_span(
            method.lstrip("/"),
            context=tracing.context_of(parent),
            kind=SpanKind.SERVER,
            attributes=attributes,
        ):
            return await inner(request, context)

    return traced


__all__ = ["ClientTracing", "ServerTracing", "client_interceptors"]
