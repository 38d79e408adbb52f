"""A bare gRPC server for the transport floor: `python -m bench.grpc_floor --port-file F`.

Two methods that answer with the bytes they were sent: /bench.Floor/Echo (unary) and
/bench.Floor/Stream (a bidi stream answering each message, as Connect answers a Commit); no
interceptor, no authentication, no protobuf decoding, no database. grpc.aio on the event
loop the control plane would pick (telemetry/event_loop.py, AGENTRUN_EVENT_LOOP), in its own
process as the control plane is. bench/commit.py times a round trip to it with a request the
size of a Commit: what any gRPC server in Python costs here before it does any work.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from telemetry import event_loop

UNARY = "/bench.Floor/Echo"
STREAM = "/bench.Floor/Stream"


async def _echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request


async def _stream(
    requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
) -> AsyncIterator[bytes]:
    async for request in requests:
        yield request


async def serve(port_file: Path) -> None:
    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "bench.Floor",
        {
            "Echo": grpc.unary_unary_rpc_method_handler(_echo),
            "Stream": grpc.stream_stream_rpc_method_handler(_stream),
        },
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await asyncio.to_thread(port_file.write_text, str(port))
    await server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.grpc_floor")
    parser.add_argument("--port-file", type=Path, required=True)
    event_loop.run(serve(parser.parse_args().port_file))


if __name__ == "__main__":
    main()
