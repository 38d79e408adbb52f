"""The Durable Streams protocol on the HTTP ingress (issue 42, docs/streams.md).

`/v1/workspaces/{workspace_id}/streams/{path}`: PUT creates a stream, POST appends (and
closes, with `Stream-Closed: true`), GET reads from `?offset=` (catch-up, or
`live=long-poll` / `live=sse`), HEAD tells its metadata, DELETE removes it. Reads need
READ in the workspace, writes OPERATE (so an operator or an admin): the same bearer
credentials as the rest of /v1/. Postgres keeps everything (control_plane/store/streams.py);
a live reader waits on `Waker`, which hears the NOTIFY of every append committed by any
replica, and re-reads the database at least every RECHECK_SECONDS whatever it hears.

The answers are the protocol's own (its reference server and conformance suite): text
errors, `Stream-Next-Offset`, `Stream-Up-To-Date`, `Stream-Cursor`, `Stream-Closed`,
ETags and 304, gzip above 1 KiB, CORS for any origin (a bearer credential, never cookies).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import gzip
import json
import logging
import math
import os
import random
import re
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import datetime
from typing import Any, TypeVar

from prometheus_client import Counter
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from control_plane.auth import context as auth_context
from control_plane.auth import privacy
from control_plane.auth.access import Need
from control_plane.http import stream_views
from control_plane.http.auth import guarded
from control_plane.http.context import HttpContext
from control_plane.http.errors import Handler, json_errors
from control_plane.ops import metrics
from control_plane.store import privacy as privacy_store
from control_plane.store import streams as store
from control_plane.store.db import Pool
from control_plane.store.notify import Listening

log = logging.getLogger(__name__)
T = TypeVar("T")

PATH = "/v1/workspaces/{workspace_id}/streams/{path:path}"
CHANNEL = "agentrun_streams"
# How long a long-poll (and an idle SSE connection between keep-alives) waits;
# AGENTRUN_STREAM_LONG_POLL_SECONDS overrides it (the conformance test waits less).
LONG_POLL_SECONDS = 20.0
RECHECK_SECONDS = 2.0
# The platform's streams are projections of the step log, which no NOTIFY announces: their
# live readers look again this often (WatchRun polls as often), all of a stream's together
# (Waker's tick), so that they share their reads.
PLATFORM_RECHECK_SECONDS = 0.25
RECHECK_TICKS = round(RECHECK_SECONDS / PLATFORM_RECHECK_SECONDS)
MAX_APPEND_BYTES = 64 << 20  # one append (or a create's first data)
MAX_NAME_BYTES = 1024  # a stream's path, a producer's id
COMPRESS_ABOVE = 1024
# The SSE data events of messages up to ENCODED_MAX_BYTES are kept for the other readers
# of the same shared read, ENCODED_LIMIT of them at most (then forgotten all at once).
ENCODED_MAX_BYTES = 16 << 10
ENCODED_LIMIT = 1024
CURSOR_EPOCH = 1728432000  # 2024-10-09T00:00:00Z, the protocol's cursor epoch
CURSOR_INTERVAL = 20

SECURITY = {
    "access-control-allow-origin": "*",
    "access-control-allow-methods": "GET, POST, PUT, DELETE, HEAD, OPTIONS",
    "access-control-allow-headers": (
        "content-type, authorization, Stream-Seq, Stream-TTL, Stream-Expires-At, "
        "Stream-Closed, Producer-Id, Producer-Epoch, Producer-Seq, Stream-Forked-From, "
        "Stream-Fork-Offset, Stream-Fork-Sub-Offset, If-None-Match"
    ),
    "access-control-expose-headers": (
        "Stream-Next-Offset, Stream-Cursor, Stream-Up-To-Date, Stream-Closed, "
        "Producer-Epoch, Producer-Seq, Producer-Expected-Seq, Producer-Received-Seq, "
        "etag, content-type, content-encoding, vary"
    ),
    "x-content-type-options": "nosniff",
    "cross-origin-resource-policy": "cross-origin",
}
OFFSET = re.compile(r"^(-1|now|\d+_\d+)$")
FORK_OFFSET = re.compile(r"^\d+_\d+$")
COUNT = re.compile(r"^(0|[1-9]\d*)$")
INTEGER = re.compile(r"^\d+$")
MEDIA_TYPE = re.compile(r"^[\w-]+/[\w-]+")
SAFE_INTEGER = 2**53 - 1


LIVE_READS = Counter(
    "agentrun_stream_live_reads",
    "Reads of the database for woken live stream readers (SharedReads), by question "
    "(look: the tick's look at a run's or a session's stream for all its readers; "
    "tail: where a stream is now; members: a private session's members, whom its readers "
    "must be among; after: what follows an offset; touch: a TTL restarted), by the projection "
    "read "
    "(whole, projected, or any when every reader's answer is the same) and by outcome "
    "(asked: this reader asked Postgres; shared: it had the answer of a read in flight)",
    ["question", "projection", "outcome"],
    registry=metrics.REGISTRY,
)


def long_poll_seconds() -> float:
    raw = os.environ.get("AGENTRUN_STREAM_LONG_POLL_SECONDS", "")
    try:
        return float(raw) if raw else LONG_POLL_SECONDS
    except ValueError:
        return LONG_POLL_SECONDS


# A stream as the waker knows it: a workspace stream's id (woken by NOTIFY), or a platform
# stream's workspace and path (woken by the tick).
WakeKey = int | tuple[str, str]
# A platform stream's look for the tick: something that differs once it has moved.
Probe = Callable[[], Awaitable[object]]


class Waker:
    """Wakes this replica's live readers of a stream when any replica commits to it.

    One LISTEN connection per replica, opened on the first live read; whatever it hears, a
    workspace stream's readers are woken every RECHECK_SECONDS too (all of a stream's at
    once, by the tick: they share that look), for what a lost NOTIFY did not say. The
    platform's streams (stream_views), which no NOTIFY announces, are looked at by a tick
    every PLATFORM_RECHECK_SECONDS instead, once per stream whatever its readers (their
    probe: its tail, and a private session's members), and all of its live readers woken at
    once when that changed (or when it could not look), so that they share one read per
    question (SharedReads); idle readers cost nothing. A stream without a probe (the feed,
    whose tail is each reader's own) wakes its readers at every tick."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._waiting: dict[WakeKey, set[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None
        self._ticking: asyncio.Task[None] | None = None
        self._probes: dict[WakeKey, Probe] = {}
        self._looked: dict[WakeKey, object] = {}  # what each probe saw last
        # How many times each watched stream's readers were woken: a read begun at
        # generation g sees every append they were woken for up to g (SharedReads).
        self._generations: dict[WakeKey, int] = {}

    def generation(self, key: WakeKey) -> int:
        return self._generations.get(key, 0)

    def _heard(self, payload: str) -> None:
        with contextlib.suppress(ValueError):
            self._wake(int(payload))

    def _wake(self, key: WakeKey) -> None:
        waiting = self._waiting.get(key)
        if waiting:
            self._generations[key] = self._generations.get(key, 0) + 1
            for event in waiting:
                event.set()

    async def _tick(self) -> None:
        ticks = 0
        while True:
            await asyncio.sleep(PLATFORM_RECHECK_SECONDS)
            ticks += 1
            try:
                if ticks % RECHECK_TICKS == 0:  # a NOTIFY may have been lost: look again
                    for stream_id in [k for k in self._waiting if isinstance(k, int)]:
                        self._wake(stream_id)
                keys = [k for k in self._waiting if not isinstance(k, int)]
                await asyncio.gather(*(self._look(key) for key in keys))
            except Exception:  # noqa: BLE001 - the tick must go on: readers wait on it
                log.exception("stream waker tick")

    async def _look(self, key: WakeKey) -> None:
        """Wake the key's readers if its probe saw it move since it last looked. The probe
        reads before the wake it causes, so a reader's read at the new generation, or after
        it, sees whatever moved before; what moves after is the next look's."""
        probe = self._probes.get(key)
        if probe is None:
            self._wake(key)
            return
        LIVE_READS.labels("look", "any", "asked").inc()
        try:
            seen = await probe()
        except Exception as exc:  # noqa: BLE001 - the readers look themselves instead
            log.info("stream waker cannot look at %s: %s", key, exc)
            self._wake(key)
            return
        if key in self._waiting and self._looked.get(key, self) != seen:
            self._looked[key] = seen
            self._wake(key)

    async def _listen(self) -> None:
        while True:
            try:
                channel = await Listening.open(self._dsn, CHANNEL, self._heard)
            except Exception as exc:  # noqa: BLE001 - the database may be restarting
                log.info("stream waker cannot connect: %s", exc)
                await asyncio.sleep(1.0)
                continue
            try:
                for stream_id in list(self._waiting):  # missed while away: look again
                    self._wake(stream_id)
                await channel.lost()
            finally:
                await channel.close()

    @contextlib.contextmanager
    def watching(self, key: WakeKey, probe: Probe | None = None) -> Iterator[asyncio.Event]:
        if isinstance(key, int) and (self._task is None or self._task.done()):
            self._task = asyncio.create_task(self._listen(), name="stream-waker")
        if self._ticking is None or self._ticking.done():
            self._ticking = asyncio.create_task(self._tick(), name="stream-waker-tick")
        event = asyncio.Event()
        self._waiting.setdefault(key, set()).add(event)
        if probe is not None:
            self._probes.setdefault(key, probe)
        try:
            yield event
        finally:
            waiting = self._waiting.get(key)
            if waiting is not None:
                waiting.discard(event)
                if not waiting:
                    del self._waiting[key]
                    self._generations.pop(key, None)
                    self._probes.pop(key, None)
                    self._looked.pop(key, None)


def text(status: int, message: str = "", headers: dict[str, str] | None = None) -> Response:
    return Response(
        message,
        status_code=status,
        media_type="text/plain",
        headers={**SECURITY, **(headers or {})},
    )


def _refused(exc: store.StreamRefused) -> Response:
    return text(exc.status, exc.message, exc.headers)


def response_cursor(client: str | None) -> str:
    """The protocol's cache-busting cursor: the current 20 s interval, or past the
    client's by a random jitter when it is not behind."""
    current = math.floor((time.time() - CURSOR_EPOCH) / CURSOR_INTERVAL)
    if not client:
        return str(current)
    try:
        theirs = int(client)
    except ValueError:
        return str(current)
    if theirs < current:
        return str(current)
    jitter = max(1, math.ceil(random.randint(1, 3600) / CURSOR_INTERVAL))
    return str(theirs + jitter)


def _compress(body: bytes, accept: str) -> tuple[bytes, str]:
    if len(body) < COMPRESS_ABOVE or not accept:
        return body, ""
    names = [part.split(";")[0].strip() for part in accept.lower().split(",")]
    if "gzip" in names:
        return gzip.compress(body, compresslevel=6), "gzip"
    if "deflate" in names:
        return zlib.compress(body), "deflate"
    return body, ""


def _sse_data(payload: str) -> str:
    lines = re.split(r"\r\n|\r|\n", payload)
    return "\n".join(f"data:{line}" for line in lines) + "\n\n"


async def _body(request: Request) -> bytes:
    """The request's body, refused (413) past MAX_APPEND_BYTES before it is all read."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_APPEND_BYTES:
        raise store.StreamRefused(413, f"An append may carry at most {MAX_APPEND_BYTES} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_APPEND_BYTES:
            raise store.StreamRefused(413, f"An append may carry at most {MAX_APPEND_BYTES} bytes")
    return bytes(body)


def _stream_path(ws: str, given: str) -> str:
    """A stream named in a header: its path under the namespace, or the whole URL path."""
    prefix = f"/v1/workspaces/{ws}/streams/"
    return given[len(prefix) :] if given.startswith(prefix) else given.lstrip("/")


def _etag(request: Request, start: str, end: str, closed: bool, internals: bool = True) -> str:
    """The read's tag; a projected read's (privacy.project_step) is not a whole one's."""
    path = base64.b64encode(request.url.path.encode()).decode()
    return f'"{path}:{start}:{end}{":c" if closed else ""}{"" if internals else ":p"}"'


def _refuse(message: str) -> store.StreamRefused:
    return store.StreamRefused(400, message)


def _expiry(h: Headers) -> tuple[int | None, str | None, datetime | None]:
    """Stream-TTL or Stream-Expires-At (one at most): seconds, or the text and its time."""
    ttl_text, expires_text = h.get("stream-ttl"), h.get("stream-expires-at")
    if ttl_text and expires_text:
        raise _refuse("Cannot specify both Stream-TTL and Stream-Expires-At")
    if ttl_text:
        if not COUNT.match(ttl_text):
            raise _refuse("Invalid Stream-TTL value")
        return int(ttl_text), None, None
    if not expires_text:
        return None, None, None
    try:
        when = datetime.fromisoformat(expires_text)
    except ValueError:
        raise _refuse("Invalid Stream-Expires-At timestamp") from None
    if when.tzinfo is None:
        raise _refuse("Invalid Stream-Expires-At timestamp: it must name its time zone")
    return None, expires_text, when


def _fork(ws: str, h: Headers) -> tuple[str | None, str | None, int | None]:
    """Stream-Forked-From, Stream-Fork-Offset and Stream-Fork-Sub-Offset, checked."""
    forked_from = h.get("stream-forked-from") or None
    fork_offset = h.get("stream-fork-offset") or None
    if fork_offset and not FORK_OFFSET.match(fork_offset):
        raise _refuse("Invalid Stream-Fork-Offset format")
    sub_text = h.get("stream-fork-sub-offset")
    if sub_text is None:
        sub = None
    elif not forked_from:
        raise _refuse("Stream-Fork-Sub-Offset requires Stream-Forked-From")
    elif not COUNT.match(sub_text):
        raise _refuse("Invalid Stream-Fork-Sub-Offset format")
    else:
        sub = int(sub_text)
    return (_stream_path(ws, forked_from) if forked_from else None), fork_offset, sub


def _create_options(ws: str, h: Headers, body: bytes) -> store.CreateOptions:
    forked_from, fork_offset, sub = _fork(ws, h)
    content_type = h.get("content-type")
    if not content_type or not content_type.strip() or not MEDIA_TYPE.match(content_type):
        content_type = None if forked_from else "application/octet-stream"
    ttl, expires_text, expires_time = _expiry(h)
    return store.CreateOptions(
        content_type=content_type,
        ttl_seconds=ttl,
        expires_at=expires_text,
        expires_at_time=expires_time,
        closed=h.get("stream-closed") == "true",
        forked_from=forked_from,
        fork_offset=fork_offset,
        fork_sub_offset=sub,
        initial=body,
    )


def _read_params(request: Request) -> tuple[str | None, str | None, str | None]:
    """?offset= (one, well formed), ?live= (long-poll and sse need an offset), ?cursor=."""
    params = request.query_params
    offsets = params.getlist("offset")
    offset = offsets[0] if offsets else None
    live = params.get("live")
    if offset is not None:
        if offset == "":
            raise _refuse("Empty offset parameter")
        if len(offsets) > 1:
            raise _refuse("Multiple offset parameters not allowed")
        if not OFFSET.match(offset):
            raise _refuse("Invalid offset format")
    if live in ("long-poll", "sse") and not offset:
        raise _refuse(f"{'SSE' if live == 'sse' else 'Long-poll'} requires offset parameter")
    return offset, live, params.get("cursor")


class SharedReads:
    """One read of the database at a time per question for this replica's live readers.

    An append wakes every live reader of its stream at once, and each asks the same two
    questions (where is the tail now; what comes after the offset they all are at): the
    first asks Postgres, the others wait for its answer instead of taking a connection of
    the pool each. Only readers that were woken (or rechecked) share, and only a read
    begun at their stream's current waker generation: it began after the NOTIFY that woke
    them, so it sees the append they were woken for. A first read of a request never
    shares (the append a client just made is always seen). Off with
    AGENTRUN_STREAM_SHARED_READS=off (to measure what it saves: bench/streams.py). Each
    read is counted in /metrics (LIVE_READS): asked, or shared, by question and projection.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._running: dict[tuple[object, ...], asyncio.Future[Any]] = {}

    async def once(
        self,
        key: tuple[object, ...],
        read: Callable[[], Awaitable[T]],
        question: str = "other",
        projection: str = "any",
    ) -> T:
        if not self.enabled:
            LIVE_READS.labels(question, projection, "asked").inc()
            return await read()
        running = self._running.get(key)
        LIVE_READS.labels(question, projection, "asked" if running is None else "shared").inc()
        if running is None:
            running = asyncio.ensure_future(read())
            self._running[key] = running
            running.add_done_callback(functools.partial(self._done, key))
        # A reader that goes away does not cancel the others' read.
        return await asyncio.shield(running)  # type: ignore[no-any-return]

    def _done(self, key: tuple[object, ...], read: asyncio.Future[Any]) -> None:
        if self._running.get(key) is read:
            del self._running[key]
        if not read.cancelled():
            read.exception()  # retrieved: each waiting reader raises it itself


def shared_reads_mode() -> str:
    """AGENTRUN_STREAM_SHARED_READS: `on` (the default), `off` (every woken reader reads for
    itself), or `per-reader` (as before the tick: a platform stream's live readers look on
    their own timers, and share a look at where it is only with readers of the same
    principal). The last two are for bench/streams.py's before-and-after figures."""
    mode = os.environ.get("AGENTRUN_STREAM_SHARED_READS", "on").strip().lower()
    return mode if mode in ("off", "per-reader") else "on"


def _projection(stream: store.Stream) -> str:
    return "whole" if stream.internals else "projected"


class StreamRoutes:
    def __init__(self, pool: Pool, waker: Waker, long_poll_seconds: float) -> None:
        self.pool = pool
        self.waker = waker
        self.long_poll = long_poll_seconds
        self.mode = shared_reads_mode()
        self.shared = SharedReads(self.mode != "off")
        # Messages' SSE data events as last encoded, by message (the message is kept, so
        # its id is not another's while it is here).
        self._encoded: dict[int, tuple[store.Message, str]] = {}

    def wake_key(self, stream: store.Stream) -> WakeKey:
        """What wakes the stream's live readers: its NOTIFYs, or the platform's tick (none
        in `per-reader` mode: each reader looks again on its own timer)."""
        if stream.stream_id or self.mode == "per-reader":
            return stream.stream_id
        return (stream.workspace_id, stream.path)

    async def touch(self, stream: store.Stream, shared: bool = False) -> None:
        """The stream was read (its TTL starts again): once per wake when `shared`."""
        if stream.ttl_seconds is None:
            return
        if not shared:
            await store.touch(self.pool, stream)
            return
        key = ("touch", stream.stream_id, self.waker.generation(stream.stream_id))
        await self.shared.once(key, lambda: store.touch(self.pool, stream), "touch")

    async def stream_again(self, ws: str, stream: store.Stream) -> store.Stream | None:
        """A woken live reader's look at the stream (shared, SharedReads).

        A run's or a session's tail is the same for every reader: one read for all of
        them, whatever their principal and projection; then, only when the stream is a
        private session's, its members (one read for all of them too), among whom the
        reader must (still) be. Membership is read at every wake (and a change of members
        wakes them: Waker), so a removed member's live read ends at the next.
        The feed's tail is its reader's own (privacy.py); a workspace stream has no reader.
        """
        gen = self.waker.generation(self.wake_key(stream))
        path = stream.path
        own: tuple[object, ...] = ("at", ws, path, stream.stream_id, stream.reader)
        own += (stream.internals, gen)  # this reader's own look, shared with its like
        if self.mode == "per-reader" and not stream.stream_id and not stream_views.is_feed(path):
            return await self.shared.once(own, lambda: self._as_before(ws, stream), "tail")
        if stream.stream_id or stream_views.is_feed(path):
            return await self.shared.once(own, lambda: self.again(ws, stream), "tail")
        at = await self.shared.once(
            ("tail", ws, path, gen), lambda: stream_views.tail(self.pool, ws, path), "tail"
        )
        if at is None:
            return None
        private = at.private_session
        if private is not None and stream.reader is not None:
            members = await self.shared.once(
                ("members", ws, private, gen),
                lambda: privacy_store.members(self.pool, ws, private),
                "members",
            )
            if stream_views.hidden_from(at, stream.reader, members):
                return None
        return stream_views.seen_by(at, stream.reader, stream.internals)

    async def _as_before(self, ws: str, stream: store.Stream) -> store.Stream | None:
        """`per-reader` mode (bench/streams.py's before): a woken reader of a run's stream
        looks up whether its principal may see the run, then the tail, at every look."""
        kind, _, name = stream.path.removeprefix(stream_views.PREFIX).partition("/")
        reader = stream.reader
        if kind == "runs" and reader is not None:
            hidden = await privacy_store.run_hidden(self.pool, ws, uuid.UUID(name), reader)
            if hidden:
                return None
        return await self.again(ws, stream)

    async def messages_again(
        self, stream: store.Stream, after: str
    ) -> tuple[list[store.Message], bool]:
        """A woken live reader's read after `after` (shared, SharedReads)."""
        gen = self.waker.generation(self.wake_key(stream))
        key = (
            "after",
            stream.workspace_id,
            stream.path,
            stream.stream_id,
            stream.tail_offset,
            stream.closed,
            # The feed's messages are its reader's own (privacy.py); a run's or a session's
            # are the same for every reader who may see it (its view checked that).
            stream.reader if stream_views.is_feed(stream.path) else None,
            # A run's and a session's steps are projected for readers below operator
            # (privacy.project_step): those share reads only with their like.
            stream.internals,
            after,
            gen,
        )
        return await self.shared.once(
            key, lambda: self.messages_after(stream, after), "after", _projection(stream)
        )

    async def stream_at(
        self, ws: str, path: str, reader: str | None, *, internals: bool
    ) -> store.Stream | None:
        """The stream at `path`; a platform one as `reader` sees it (privacy.reader()),
        its steps whole or projected (`internals`: privacy.sees_internals())."""
        if stream_views.is_platform(path):
            return await stream_views.view(self.pool, ws, path, reader, internals)
        return await store.get(self.pool, ws, path)

    async def again(self, ws: str, stream: store.Stream) -> store.Stream | None:
        """stream_at as `stream`'s reader saw it last."""
        return await self.stream_at(ws, stream.path, stream.reader, internals=stream.internals)

    async def messages_after(
        self, stream: store.Stream, after: str
    ) -> tuple[list[store.Message], bool]:
        if stream.stream_id == 0:  # the platform's (stream_views: no row of its own)
            return await stream_views.read(self.pool, stream, after)
        return await store.read(self.pool, stream, after)

    async def wait(self, ws: str, stream: store.Stream, after: str) -> None:
        """Until the stream may have moved past `after` or closed, or the long-poll ends."""
        deadline = time.monotonic() + self.long_poll
        key = self.wake_key(stream)
        # A woken reader looks again at once. The Waker's tick wakes a workspace stream's
        # readers every RECHECK_SECONDS (for a NOTIFY lost), the feed's at every tick, and
        # a run's or a session's when its look for all of them saw it move: they wait for
        # that alone. In per-reader mode each looks again on its own timer.
        probe = None
        unwoken = PLATFORM_RECHECK_SECONDS if isinstance(key, int) and not key else self.long_poll
        if not isinstance(key, int) and not stream_views.is_feed(stream.path):
            probe = self._probe(ws, stream.path)
        with self.waker.watching(key, probe) as event:
            while (left := deadline - time.monotonic()) > 0:
                event.clear()
                current = await self.stream_again(ws, stream)
                if current is None or current.soft_deleted or current.closed:
                    return
                if current.tail_offset != after and current.tail_offset > after:
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), timeout=min(left, unwoken))

    def _probe(self, ws: str, path: str) -> Probe:
        """The tick's look at a run's or a session's stream, the same for all its readers:
        its tail and closing, and a private session's members (a removal wakes them)."""

        async def probe() -> object:
            at = await stream_views.tail(self.pool, ws, path)
            if at is None:
                return None
            private = at.private_session
            members = await privacy_store.members(self.pool, ws, private) if private else None
            return (at.stream.tail_offset, at.stream.closed, private, members)

        return probe

    async def create(self, request: Request, ws: str, path: str) -> Response:
        h = request.headers
        opts = _create_options(ws, h, await _body(request))
        stream, created = await store.create(self.pool, ws, path, opts)
        headers = {
            "content-type": stream.content_type or opts.content_type or "application/octet-stream",
            "Stream-Next-Offset": stream.tail_offset,
        }
        if created:
            headers["location"] = str(request.url.replace(query=""))
        if stream.closed:
            headers["Stream-Closed"] = "true"
        return Response(b"", status_code=201 if created else 200, headers={**SECURITY, **headers})

    async def head(self, request: Request, ws: str, path: str) -> Response:
        stream = await self.stream_at(
            ws, path, privacy.reader(), internals=privacy.sees_internals()
        )
        if stream is None:
            return text(404)
        if stream.soft_deleted:
            return text(410)
        headers = {"Stream-Next-Offset": stream.tail_offset, "cache-control": "no-store"}
        if stream.content_type:
            headers["content-type"] = stream.content_type
        if stream.closed:
            headers["Stream-Closed"] = "true"
        if stream.ttl_seconds is not None:
            headers["Stream-TTL"] = str(stream.ttl_seconds)
        if stream.expires_at:
            headers["Stream-Expires-At"] = stream.expires_at
        headers["etag"] = _etag(request, "-1", stream.tail_offset, stream.closed, stream.internals)
        return Response(b"", status_code=200, headers={**SECURITY, **headers})

    async def read(self, request: Request, ws: str, path: str) -> Response:
        stream = await self.stream_at(
            ws, path, privacy.reader(), internals=privacy.sees_internals()
        )
        if stream is None:
            return text(404, "Stream not found")
        if stream.soft_deleted:
            return text(410, "Stream is gone")
        offset, live, cursor = _read_params(request)
        if live == "sse":
            assert offset is not None
            return self._sse(ws, stream, stream.tail_offset if offset == "now" else offset, cursor)
        if offset == "now" and live != "long-poll":
            return await self._now(stream)
        after = stream.tail_offset if offset == "now" else offset
        start = store.ZERO if after in (None, "-1") else after
        assert start is not None
        messages, up_to_date = await self.messages_after(stream, start)
        await store.touch(self.pool, stream)
        if live == "long-poll" and after == stream.tail_offset and not messages:
            polled = await self._long_poll(ws, stream, start, cursor)
            if isinstance(polled, Response):
                return polled
            stream, messages, up_to_date = polled
        return await self._catch_up(request, ws, stream, messages, up_to_date, offset, live)

    async def _now(self, stream: store.Stream) -> Response:
        """?offset=now without waiting: nothing, and where the tail is."""
        headers = {
            "Stream-Next-Offset": stream.tail_offset,
            "Stream-Up-To-Date": "true",
            "cache-control": "no-store",
        }
        if stream.content_type:
            headers["content-type"] = stream.content_type
        if stream.closed:
            headers["Stream-Closed"] = "true"
        await store.touch(self.pool, stream)
        body = b"[]" if stream.is_json else b""
        return Response(body, status_code=200, headers={**SECURITY, **headers})

    async def _long_poll(
        self, ws: str, stream: store.Stream, start: str, cursor: str | None
    ) -> Response | tuple[store.Stream, list[store.Message], bool]:
        """A reader at the tail waits for the next append: what came, or a 204."""
        if stream.closed:
            closed = {"Stream-Up-To-Date": "true", "Stream-Closed": "true"}
            return text(204, headers={"Stream-Next-Offset": stream.tail_offset, **closed})
        await self.wait(ws, stream, start)
        current = await self.stream_again(ws, stream)
        if current is None or current.soft_deleted:
            return text(404, "Stream not found")
        messages, up_to_date = await self.messages_again(current, start)
        await self.touch(current, shared=True)
        if messages:
            return current, messages, up_to_date
        headers = {
            "Stream-Next-Offset": start,
            "Stream-Up-To-Date": "true",
            "Stream-Cursor": response_cursor(cursor),
        }
        if current.closed:
            headers["Stream-Closed"] = "true"
        return text(204, headers=headers)

    async def _catch_up(
        self,
        request: Request,
        ws: str,
        stream: store.Stream,
        messages: list[store.Message],
        up_to_date: bool,
        offset: str | None,
        live: str | None,
    ) -> Response:
        """Messages as one body, with where to read next, an ETag, gzip when it pays."""
        headers = {}
        if stream.content_type:
            headers["content-type"] = stream.content_type
        end = messages[-1].offset if messages else stream.tail_offset
        headers["Stream-Next-Offset"] = end
        if live == "long-poll":
            headers["Stream-Cursor"] = response_cursor(request.query_params.get("cursor"))
        if up_to_date:
            headers["Stream-Up-To-Date"] = "true"
        current = await self.again(ws, stream) if messages else stream
        closed = current is not None and current.closed and end == current.tail_offset
        if closed and up_to_date:
            headers["Stream-Closed"] = "true"
        etag = _etag(request, offset or "-1", end, closed and up_to_date, stream.internals)
        headers["etag"] = etag
        if request.headers.get("if-none-match") == etag:
            return Response(b"", status_code=304, headers={**SECURITY, "etag": etag})
        body, encoding = _compress(
            store.body_of(stream, messages), request.headers.get("accept-encoding", "")
        )
        if encoding:
            headers["content-encoding"] = encoding
            headers["vary"] = "accept-encoding"
        return Response(body, status_code=200, headers={**SECURITY, **headers})

    def _sse(self, ws: str, stream: store.Stream, start: str, cursor: str | None) -> Response:
        ct = store.normalize(stream.content_type)
        binary = not (ct.startswith("text/") or ct == "application/json")
        headers = {
            **SECURITY,
            "content-type": "text/event-stream",
            "cache-control": "no-cache",
            "connection": "keep-alive",
        }
        if binary:
            headers["Stream-SSE-Data-Encoding"] = "base64"
        return StreamingResponse(
            self._events(ws, stream, start, cursor, binary),
            headers=headers,
        )

    async def _events(
        self, ws: str, stream: store.Stream, start: str, cursor: str | None, binary: bool
    ) -> AsyncIterator[str]:
        after = store.ZERO if start == "-1" else start
        woken: store.Stream | None = None  # the stream as a woken reader last saw it
        while True:
            if woken is None:
                latest = await self.again(ws, stream)
                if latest is None or latest.soft_deleted:
                    return
                messages, up_to_date = await self.messages_after(latest, after)
            else:
                latest = woken
                messages, up_to_date = await self.messages_again(latest, after)
            await self.touch(latest, shared=woken is not None)
            end = messages[-1].offset if messages else latest.tail_offset if up_to_date else after
            at_tail = end == latest.tail_offset
            closing = latest.closed and at_tail and up_to_date
            events: list[str] = []
            for i, message in enumerate(messages):
                last = i == len(messages) - 1
                events.append(self._data_event(latest, message, binary))
                events.append(
                    self._control(message.offset, cursor, last and up_to_date, last and closing)
                )
            if not messages:
                events.append(self._control(end, cursor, up_to_date, closing))
            yield "".join(events)
            if closing:
                return
            after = end
            woken = None
            if up_to_date:
                await self.wait(ws, latest, after)
                moved = await self.stream_again(ws, latest)
                if moved is None or moved.soft_deleted:
                    return
                if moved.tail_offset == after and not moved.closed:
                    yield self._control(after, cursor, True, False)
                woken = moved

    def _data_event(self, stream: store.Stream, message: store.Message, binary: bool) -> str:
        """The message's SSE data event, encoded once for all the readers a shared read
        (SharedReads) handed the same message to."""
        known = self._encoded.get(id(message))
        if known is not None and known[0] is message:
            return known[1]
        event = "event: data\n" + _sse_data(self._payload(stream, message, binary))
        if len(message.data) <= ENCODED_MAX_BYTES:
            if len(self._encoded) >= ENCODED_LIMIT:
                self._encoded.clear()
            self._encoded[id(message)] = (message, event)
        return event

    @staticmethod
    def _payload(stream: store.Stream, message: store.Message, binary: bool) -> str:
        if binary:
            return base64.b64encode(message.data).decode()
        if stream.is_json:
            return store.body_of(stream, [message]).decode()
        return message.data.decode("utf-8", errors="replace")

    @staticmethod
    def _control(offset: str, cursor: str | None, up_to_date: bool, closed: bool) -> str:
        """A control event: where the reader is, and whether it is caught up or the end."""
        data: dict[str, object] = {"streamNextOffset": offset}
        if closed:
            data["streamClosed"] = True
        else:
            data["streamCursor"] = response_cursor(cursor)
            if up_to_date:
                data["upToDate"] = True
        return "event: control\n" + _sse_data(json.dumps(data, separators=(",", ":")))

    async def append(self, request: Request, ws: str, path: str) -> Response:
        h = request.headers
        close = h.get("stream-closed") == "true"
        pid, epoch_text, seq_text = (
            h.get("producer-id"),
            h.get("producer-epoch"),
            h.get("producer-seq"),
        )
        given = [v is not None for v in (pid, epoch_text, seq_text)]
        if any(given) and not all(given):
            return text(
                400,
                "All producer headers (Producer-Id, Producer-Epoch, Producer-Seq) "
                "must be provided together",
            )
        producer: store.Producer | None = None
        if pid is not None and epoch_text is not None and seq_text is not None:
            if pid == "":
                return text(400, "Invalid Producer-Id: must not be empty")
            if len(pid.encode()) > MAX_NAME_BYTES:
                return text(400, f"Invalid Producer-Id: at most {MAX_NAME_BYTES} bytes")
            if not INTEGER.match(epoch_text) or int(epoch_text) > SAFE_INTEGER:
                return text(400, "Invalid Producer-Epoch: must be a non-negative integer")
            if not INTEGER.match(seq_text) or int(seq_text) > SAFE_INTEGER:
                return text(400, "Invalid Producer-Seq: must be a non-negative integer")
            producer = store.Producer(pid, int(epoch_text), int(seq_text))
        body = await _body(request)
        if not body and close:
            result = await store.close(self.pool, ws, path, producer)
        elif not body:
            return text(400, "Empty body")
        elif not h.get("content-type"):
            return text(400, "Content-Type header is required")
        else:
            result = await store.append(
                self.pool,
                ws,
                path,
                body,
                content_type=h.get("content-type"),
                seq=h.get("stream-seq"),
                producer=producer,
                close=close,
            )
        return self._appended(result, producer, close and not body)

    def _appended(
        self, result: store.AppendResult, producer: store.Producer | None, close_only: bool
    ) -> Response:
        status = result.status
        if status == "stream_closed":
            return text(
                409,
                "Stream is closed",
                {"Stream-Closed": "true", "Stream-Next-Offset": result.offset},
            )
        if status == "stale_epoch":
            return text(403, "Stale producer epoch", {"Producer-Epoch": str(result.current_epoch)})
        if status == "invalid_epoch_seq":
            return text(400, "New epoch must start with sequence 0")
        if status == "sequence_gap":
            return text(
                409,
                "Producer sequence gap",
                {
                    "Producer-Expected-Seq": str(result.expected_seq),
                    "Producer-Received-Seq": str(result.received_seq),
                },
            )
        headers: dict[str, str] = {}
        if status == "duplicate":
            assert producer is not None
            headers["Producer-Epoch"] = str(producer.epoch)
            headers["Producer-Seq"] = str(result.last_seq)
            if result.closed:
                headers["Stream-Closed"] = "true"
                headers["Stream-Next-Offset"] = result.offset
            return text(204, headers=headers)
        headers["Stream-Next-Offset"] = result.offset
        if producer is not None:
            headers["Producer-Epoch"] = str(producer.epoch)
            headers["Producer-Seq"] = str(producer.seq)
        if result.closed:
            headers["Stream-Closed"] = "true"
        code = 200 if producer is not None and not close_only else 204
        return text(code, headers=headers)

    async def delete(self, request: Request, ws: str, path: str) -> Response:
        await store.delete(self.pool, ws, path)
        return text(204)


def routes(ctx: HttpContext) -> list[Route]:
    streams = StreamRoutes(ctx.pool, Waker(ctx.config.database_url), long_poll_seconds())
    resolver = ctx.credentials()
    methods = {
        "PUT": (Need.OPERATE, streams.create),
        "POST": (Need.OPERATE, streams.append),
        "DELETE": (Need.OPERATE, streams.delete),
        "GET": (Need.READ, streams.read),
        "HEAD": (Need.READ, streams.head),
    }

    def handler_for(method: str) -> Handler:
        need, serve = methods[method]

        async def handle(request: Request) -> Response:
            ws = auth_context.workspace(request.path_params["workspace_id"])
            path = request.path_params["path"]
            if not path or len(path.encode()) > MAX_NAME_BYTES:
                return text(400, f"A stream's path has 1 to {MAX_NAME_BYTES} bytes")
            if need is not Need.READ and stream_views.is_platform(path):
                return text(405, f"{stream_views.PREFIX} streams are the platform's: read-only")
            try:
                return await serve(request, ws, path)
            except store.StreamRefused as exc:
                return _refused(exc)

        return json_errors(guarded(resolver, need, handle))

    guarded_methods = {method: handler_for(method) for method in methods}

    async def endpoint(request: Request) -> Response:
        if request.method == "OPTIONS":
            return Response(b"", status_code=204, headers=SECURITY)
        serve = guarded_methods.get(request.method)
        if serve is None:
            return text(405, "Method not allowed")
        response = await serve(request)
        for name, value in SECURITY.items():
            response.headers.setdefault(name, value)
        return response

    return [Route(PATH, endpoint, methods=["GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS"])]
