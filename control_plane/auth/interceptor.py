"""The one gRPC interceptor that authenticates every call and checks its capability.

It reads `authorization: Bearer <token>`, resolves it to a Principal (the
shared Resolver), checks the method's entry in `access.ACCESS` and runs the
handler inside `context.acting_as(principal)`. Health and reflection stay
open; a method missing from the table is refused. Streams, the bidi
`ExecutorService.Connect` included, are authenticated once, when they open.

A request that did not decode (undecodable bytes, a NUL in a string: ground/decoding.py)
reaches this interceptor as a `Refused`: the credential (and the method's capability) is
checked first, so a bad key is UNAUTHENTICATED whatever it sent, and only a caller who may
call the method learns what is wrong with the request (INVALID_ARGUMENT).

Order: `interceptors=[ErrorInterceptor(), IdentityInterceptor(...)]`, so the
error interceptor wraps this one and maps its domain errors for unary and
server-streaming calls. It leaves client-streaming calls alone, so this
interceptor aborts those itself.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from control_plane.auth import access, audit, context
from control_plane.auth.mtls import executor_from_peer
from control_plane.auth.principal import Principal
from control_plane.auth.resolver import Resolver
from control_plane.ground.decoding import Refused, credential_first
from control_plane.ground.errors import (
    DomainError,
    InvalidArgument,
    PermissionDenied,
    RequestRefused,
    status_for,
)

log = logging.getLogger(__name__)

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]]


def _metadata(context_: grpc.aio.ServicerContext, name: str) -> str | None:
    for key, value in context_.invocation_metadata() or ():
        if key == name:
            return value if isinstance(value, str) else None
    return None


class IdentityInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, resolver: Resolver) -> None:
        self._resolver = resolver
        # The checked handler made for each method, with the handler it wraps: the server
        # hands back the same handler object every call, so it is wrapped once, not per call.
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def authorize(
        self, method: str, need: access.Need | None, ctx: grpc.aio.ServicerContext, request: Any
    ) -> Principal:
        """The caller of `method`, or a domain error (UNAUTHENTICATED / PERMISSION_DENIED)."""
        workspace_id = getattr(request, "workspace_id", "") if request is not None else ""
        who = await self._resolver.resolve(_metadata(ctx, "authorization"), workspace_id)
        if need is None:
            raise PermissionDenied(f"{method} is not open to any credential")
        if not access.allows(need, who):
            raise PermissionDenied(f"a {who.kind.value} credential may not call {method}")
        return who

    async def refuse_after_credential(
        self, method: str, need: access.Need | None, ctx: grpc.aio.ServicerContext, bad: Refused
    ) -> None:
        """Raise for a request that did not decode: UNAUTHENTICATED or PERMISSION_DENIED for
        its caller first, else INVALID_ARGUMENT naming what is wrong with it."""
        # A person's verified token with no workspace to read it against: the request decides.
        with contextlib.suppress(InvalidArgument):
            await self.authorize(method, need, ctx, None)
        raise RequestRefused(bad)

    async def _stream_caller(
        self, method: str, need: access.Need | None, ctx: grpc.aio.ServicerContext
    ) -> Principal:
        """A bidi stream's caller: its bearer key, else a verified executor client certificate
        (mutual TLS on the executor listener); a key, when given, decides."""
        if _metadata(ctx, "authorization") is None:
            peer = executor_from_peer(ctx.auth_context())
            if peer is not None and need is not None and access.allows(need, peer):
                return peer
        return await self.authorize(method, need, ctx, None)

    async def intercept_service(
        self, continuation: Continuation, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method = details.method
        if handler is None or access.is_open(method):
            return handler
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        checked = self._checked(method, handler)
        self._wrapped[method] = (handler, checked)
        return checked

    def _checked(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """`handler` behind the credential and capability check for `method`."""
        need = access.ACCESS.get(method)
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(
                self._bidi(method, need, handler.stream_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(method, need, handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                self._server_stream(method, need, handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return _refuse_all(handler, method)

    def _unary(
        self, method: str, need: access.Need | None, behavior: Callable[..., Awaitable[Any]]
    ) -> Callable[..., Awaitable[Any]]:
        @credential_first
        async def wrapper(request: Any, ctx: grpc.aio.ServicerContext) -> Any:
            with audit.request(audit.new_request_id(_metadata(ctx, "x-request-id"))):
                if isinstance(request, Refused):
                    await self.refuse_after_credential(method, need, ctx, request)
                who = await self.authorize(method, need, ctx, request)
                with context.acting_as(who):
                    return await behavior(request, ctx)

        return wrapper

    def _server_stream(
        self, method: str, need: access.Need | None, behavior: Callable[..., AsyncIterator[Any]]
    ) -> Callable[..., AsyncIterator[Any]]:
        @credential_first
        async def wrapper(request: Any, ctx: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            with audit.request(audit.new_request_id(_metadata(ctx, "x-request-id"))):
                if isinstance(request, Refused):
                    await self.refuse_after_credential(method, need, ctx, request)
                who = await self.authorize(method, need, ctx, request)
                with context.acting_as(who):
                    async for item in behavior(request, ctx):
                        yield item

        return wrapper

    def _bidi(
        self, method: str, need: access.Need | None, behavior: Callable[..., AsyncIterator[Any]]
    ) -> Callable[..., AsyncIterator[Any]]:
        async def wrapper(requests: Any, ctx: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                who = await self._stream_caller(method, need, ctx)
            except DomainError as exc:
                await ctx.abort(*status_for(exc))
            with context.acting_as(who):
                async for item in behavior(requests, ctx):
                    yield item

        return wrapper


def _refuse_all(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    """Client-streaming methods: none exist; refuse rather than serve one unchecked."""

    async def refuse(requests: Any, ctx: grpc.aio.ServicerContext) -> Any:
        await ctx.abort(grpc.StatusCode.PERMISSION_DENIED, f"{method} is not classified")

    return grpc.stream_unary_rpc_method_handler(
        refuse,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
