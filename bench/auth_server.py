"""`python -m bench.auth_server`: the two control planes of bench/auth.py, in one process.

`authenticated` is the shipped server (control_plane.server.start, identity interceptor and
all). `baseline` is the same server, the same servicers and the same error interceptor, with
the identity interceptor replaced by one that reads no credential and serves every call as a
fixed principal (the bench workspace's admin; an all-workspaces executor on Connect). It
exists only to measure what authentication costs, is labelled as such wherever it is
printed, and is never a mode of the product. Both serve from this one process, on the
event loop and collector settings `python -m control_plane` runs with, each on its own
port, so that the interceptor is all that differs between them. As two processes on the
standard loop, the same build's StartRun ratio read 1.04-1.17x in four runs; in one, 1.06-
1.09x (2026-12-05). Settings come from the environment (DATABASE_URL, AGENTRUN_LISTEN,
AGENTRUN_PORT_FILE), as for `python -m control_plane`; AGENTRUN_LISTEN must name port 0
(each server binds its own). The baseline's port is written to AGENTRUN_PORT_FILE with
".baseline" appended, before the authenticated one's to AGENTRUN_PORT_FILE.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from control_plane.auth import context
from control_plane.auth.interceptor import IdentityInterceptor
from control_plane.auth.principal import Kind, Principal
from control_plane.auth.resolver import Resolver
from control_plane.ground.config import ServerConfig
from control_plane.server import start, write_port_file
from telemetry import event_loop

CONNECT = "/agentrun.v1.ExecutorService/Connect"
ADMIN = Principal(Kind.KEY, "bench-baseline", workspace_id="bench", role="admin")
EXECUTOR = Principal(Kind.EXECUTOR, "bench-baseline-executors")


class FixedPrincipal(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED BASELINE: every call runs as a fixed principal; nothing is checked."""

    def __init__(self, resolver: Resolver) -> None:  # the signature start() builds it with
        del resolver

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        who = EXECUTOR if details.method == CONNECT else ADMIN
        if handler.unary_unary:
            behavior = handler.unary_unary

            async def unary(request: Any, ctx: grpc.aio.ServicerContext) -> Any:
                with context.acting_as(who):
                    return await behavior(request, ctx)

            return grpc.unary_unary_rpc_method_handler(
                unary, handler.request_deserializer, handler.response_serializer
            )
        if handler.stream_stream:
            streaming = handler.stream_stream

            async def bidi(requests: Any, ctx: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                with context.acting_as(who):
                    async for item in streaming(requests, ctx):
                        yield item

            return grpc.stream_stream_rpc_method_handler(
                bidi, handler.request_deserializer, handler.response_serializer
            )
        return handler  # health and the rest: as shipped (the benchmark calls none)


BASELINE_SUFFIX = ".baseline"


async def serve() -> None:
    config = ServerConfig.from_env()
    # The baseline first: its port is on disk before the authenticated one's, which the
    # bench waits for.
    baseline = await start(config, identity=FixedPrincipal)
    authenticated = await start(config, identity=IdentityInterceptor)
    if config.port_file:
        write_port_file(config.port_file + BASELINE_SUFFIX, baseline.port)
        write_port_file(config.port_file, authenticated.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await authenticated.stop()
    await baseline.stop()


def main() -> int:
    if len(sys.argv) != 1:
        print("usage: python -m bench.auth_server", file=sys.stderr)
        return 2
    logging.basicConfig(level=os.environ.get("AGENTRUN_LOG_LEVEL", "WARNING"))
    # As `python -m control_plane` runs: its event loop (uvloop) and collector settings.
    event_loop.run_server(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
