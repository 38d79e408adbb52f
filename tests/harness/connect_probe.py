"""Probing ExecutorService.Connect for the status a server ends it with."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from agentrun.v1 import executor_pb2, executor_pb2_grpc


async def connect_code(channel: grpc.aio.Channel, key: str | None = None) -> grpc.StatusCode:
    """The status `ExecutorService.Connect` ends with when the executor only says Hello
    (sending `key` as its bearer credential, when given).

    A server that refuses the call (no such service, no credential) ends it at once, and
    the client's write of the Hello can race that end. grpc.aio's client then reports its
    own failed write, INTERNAL "Internal error from Core", in place of the status the
    server sent (grpc/grpc#36066). Only then is the server asked again without a Hello:
    nothing written, nothing to race. A server that serves the call waits for a Hello that
    never comes, so that answer is DEADLINE_EXCEEDED, never OK."""
    code, details = await _hello_code(channel, key)
    if code == grpc.StatusCode.INTERNAL and details == CLIENT_WRITE_FAILED:
        return await _silent_code(channel, key)
    return code


# What grpc.aio's client reports when its own write fails (cygrpc _AioCall.set_internal_error).
CLIENT_WRITE_FAILED = "Internal error from Core"


def _connect(
    channel: grpc.aio.Channel,
    key: str | None,
    requests: AsyncIterator[executor_pb2.ConnectRequest] | None = None,
) -> grpc.aio.StreamStreamCall:
    """Connect with `key` as its bearer credential; `requests` None: the caller writes."""
    metadata = (("authorization", f"Bearer {key}"),) if key else None
    return executor_pb2_grpc.ExecutorServiceStub(channel).Connect(
        requests, timeout=5, metadata=metadata
    )


async def _hello_code(
    channel: grpc.aio.Channel, key: str | None
) -> tuple[grpc.StatusCode, str | None]:
    async def hello() -> AsyncIterator[executor_pb2.ConnectRequest]:
        yield executor_pb2.ConnectRequest(hello=executor_pb2.Hello(executor_id="probe"))

    call = _connect(channel, key, hello())
    try:
        async for reply in call:
            if reply.WhichOneof("msg") == "welcome":
                call.cancel()
                return grpc.StatusCode.OK, None
    except grpc.aio.AioRpcError as err:
        return err.code(), err.details()
    return await call.code(), await call.details()


async def _silent_code(channel: grpc.aio.Channel, key: str | None) -> grpc.StatusCode:
    """The status the server ends Connect with when the client writes nothing at all."""
    call = _connect(channel, key)
    try:
        await call.read()
    except grpc.aio.AioRpcError as err:
        return err.code()
    return await call.code()
