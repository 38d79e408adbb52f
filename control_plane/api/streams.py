"""StreamService: the workspace's Durable Streams read over gRPC (docs/streams.md).

The same streams, offsets and bytes as the HTTP protocol (control_plane/http/streams.py,
whose reading and live waiting this uses), so a session's or the workspace feed's reader
may move between gRPC and HTTP at any offset.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from agentrun.v1 import stream_pb2, stream_pb2_grpc
from control_plane.auth import context as auth_context
from control_plane.auth import privacy
from control_plane.ground import validate
from control_plane.ground.errors import InvalidArgument, NotFound
from control_plane.http.streams import OFFSET, StreamRoutes, Waker, long_poll_seconds
from control_plane.store import streams as store
from control_plane.store.db import Pool

MAX_PATH_BYTES = 1024


class StreamServicer(stream_pb2_grpc.StreamServiceServicer):
    def __init__(self, pool: Pool, dsn: str) -> None:
        # Its own LISTEN connection, opened on the first live read.
        self._streams = StreamRoutes(pool, Waker(dsn), long_poll_seconds())

    async def ReadStream(
        self, request: stream_pb2.ReadStreamRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[stream_pb2.ReadStreamResponse]:
        ws = auth_context.workspace(request.workspace_id)
        path = validate.text("path", request.path, max_bytes=MAX_PATH_BYTES, required=True)
        offset = request.offset or "-1"
        if not OFFSET.match(offset):
            raise InvalidArgument("offset", "must be -1, now or an offset the stream gave")
        reader = privacy.reader()  # a platform stream is this reader's view of it
        internals = privacy.sees_internals()  # its steps whole, or projected
        stream = await self._streams.stream_at(ws, path, reader, internals=internals)
        if stream is None or stream.soft_deleted:
            raise NotFound(f"stream {path} not found")
        after = {"-1": store.ZERO, "now": stream.tail_offset}.get(offset, offset)
        said = False  # the up-to-date response for where the reader is now
        while True:
            messages, up_to_date = await self._streams.messages_after(stream, after)
            for m in messages:
                data = store.body_of(stream, [m]) if stream.is_json else m.data
                yield stream_pb2.ReadStreamResponse(offset=m.offset, data=data)
                after, said = m.offset, False
            current = await self._streams.stream_at(ws, path, reader, internals=internals)
            if current is None or current.soft_deleted:
                return
            stream = current
            if not up_to_date:
                continue
            closed = stream.closed and after >= stream.tail_offset
            if not said or closed:
                at = after if messages or after != store.ZERO else stream.tail_offset
                yield stream_pb2.ReadStreamResponse(offset=at, up_to_date=True, closed=closed)
                said = True
            if closed or not request.live:
                return
            await self._streams.wait(ws, stream, after)
