"""A bare gRPC server for the transport floor: `python -m bench.grpc_floor --port-file F
[--dsn DSN]`.

Two methods that answer with the bytes they were sent: /bench.Floor/Echo (unary) and
/bench.Floor/Stream (a bidi stream answering each message, as Connect answers a Commit); no
interceptor, no authentication, no protobuf decoding, no database. grpc.aio on the event
loop the control plane would pick (telemetry/event_loop.py, AGENTRUN_EVENT_LOOP), in its own
process as the control plane is. bench/commit.py times a round trip to it with a request the
size of a Commit: what any gRPC server in Python costs here before it does any work.

With `--dsn`, a third: /bench.Floor/Commit, the minimal commit server. A bidi stream whose
every message is decoded as a ConnectRequest, its one step INSERTed (autocommit, one reused
asyncpg connection, into bench/commit.py's raw table) and answered with an encoded
CommitResult: the least a commit over a stream can do, with no lease, fence, pricing,
metrics, grouping or task per message.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import grpc

from agentrun.v1 import executor_pb2 as pb
from telemetry import event_loop

UNARY = "/bench.Floor/Echo"
STREAM = "/bench.Floor/Stream"
COMMIT = "/bench.Floor/Commit"
INSERT = "INSERT INTO bench_raw_insert (run_id, seq, payload) VALUES ($1, $2, $3)"


async def _echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request


async def _stream(
    requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
) -> AsyncIterator[bytes]:
    async for request in requests:
        yield request


def _committer(conn: asyncpg.Connection) -> object:
    async def commit(
        requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        async for request in requests:
            msg = pb.ConnectRequest.FromString(request).commit
            step = msg.steps[0]
            await conn.execute(INSERT, msg.lease.run_id, step.seq, step.payload_json)
            result = pb.CommitResult(request_id=msg.request_id, outcome=pb.COMMIT_OUTCOME_OK)
            yield pb.ConnectResponse(commit_result=result).SerializeToString()

    return commit


async def serve(port_file: Path, dsn: str | None) -> None:
    server = grpc.aio.server()
    methods = {
        "Echo": grpc.unary_unary_rpc_method_handler(_echo),
        "Stream": grpc.stream_stream_rpc_method_handler(_stream),
    }
    if dsn:
        conn = await asyncpg.connect(dsn)
        methods["Commit"] = grpc.stream_stream_rpc_method_handler(_committer(conn))
    handler = grpc.method_handlers_generic_handler("bench.Floor", methods)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await asyncio.to_thread(port_file.write_text, str(port))
    await server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.grpc_floor")
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--dsn", help="serve /bench.Floor/Commit, inserting into this database")
    args = parser.parse_args()
    event_loop.run(serve(args.port_file, args.dsn))


if __name__ == "__main__":
    main()
