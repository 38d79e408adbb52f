"""Durable Streams in Postgres: the workspace's append-only logs (issue 42, docs/streams.md).

The semantics are the Durable Streams protocol's, as its reference server and its
conformance suite (`@durable-streams/server-conformance-tests`) state them: offsets
`RRRRRRRRRRRRRRRR_BBBBBBBBBBBBBBBB` (a read sequence and a byte position, zero-padded so
that text order is log order; each append moves the position by its length plus a
5-byte frame), JSON streams that keep each append's values and serve arrays, idempotent
producers (id, epoch, seq) deduplicated here, closing, TTL and Expires-At, forks.

Every write locks the stream's row (`stream_lock`): appends to one stream are
serialised, a producer's (epoch, seq) is checked and recorded in the transaction that
writes its bytes, and the NOTIFY that wakes live readers on every replica goes out
when it commits (`stream_advance`). Expiry is read on the database clock.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from control_plane.store.db import Connection, Pool, transaction
from control_plane.store.errors import StoreError
from control_plane.store.queries import run

ZERO = "0000000000000000_0000000000000000"
FRAME_BYTES = 5  # the protocol's 4-byte length and newline: part of each offset step
END = "~"  # sorts after every offset: "to the tail"
READ_MESSAGES = 10_000  # at most this many messages in one answer (then not up to date)
READ_BYTES = 8 << 20  # nor, past the first message, more bytes than this


class StreamRefused(StoreError):
    """A request the protocol refuses: its HTTP status, a message and the headers to send."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def not_found() -> StreamRefused:
    return StreamRefused(404, "Stream not found")


def gone() -> StreamRefused:
    return StreamRefused(410, "Stream is gone")


@dataclass(frozen=True)
class Stream:
    workspace_id: str
    stream_id: int
    path: str
    content_type: str | None
    ttl_seconds: int | None
    expires_at: str | None
    tail_offset: str
    closed: bool
    closed_by: dict[str, Any] | None
    last_seq: str | None
    forked_from: int | None
    fork_offset: str | None
    fork_sub_offset: int | None
    ref_count: int
    soft_deleted: bool
    # A platform stream's reader (control_plane/auth/privacy.py): the view is theirs (None:
    # everything, as a workspace admin sees it). A workspace's own streams have none.
    reader: str | None = None
    # Whether that reader sees every step whole (privacy.sees_internals): a reader below
    # operator is served projections (privacy.project_step). Unused by a workspace's own.
    internals: bool = True

    @classmethod
    def of(cls, row: Any) -> Stream:
        return cls(
            workspace_id=row["workspace_id"],
            stream_id=row["stream_id"],
            path=row["path"],
            content_type=row["content_type"],
            ttl_seconds=row["ttl_seconds"],
            expires_at=row["expires_at_text"],
            tail_offset=row["tail_offset"],
            closed=row["closed"],
            closed_by=json.loads(row["closed_by"]) if row["closed_by"] else None,
            last_seq=row["last_seq"],
            forked_from=row["forked_from"],
            fork_offset=row["fork_offset"],
            fork_sub_offset=row["fork_sub_offset"],
            ref_count=row["ref_count"],
            soft_deleted=row["soft_deleted"],
        )

    @property
    def is_json(self) -> bool:
        return normalize(self.content_type) == "application/json"


@dataclass(frozen=True)
class Message:
    offset: str  # the stream's offset after this message
    data: bytes


@dataclass(frozen=True)
class Producer:
    producer_id: str
    epoch: int
    seq: int

    def closed(self) -> dict[str, Any]:
        return {"producer_id": self.producer_id, "epoch": self.epoch, "seq": self.seq}


@dataclass
class AppendResult:
    """What an append did: `offset` the tail after it; `status` accepted, duplicate,
    stale_epoch, invalid_epoch_seq, sequence_gap or stream_closed."""

    status: str
    offset: str = ""
    closed: bool = False
    last_seq: int = 0
    current_epoch: int = 0
    expected_seq: int = 0
    received_seq: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CreateOptions:
    content_type: str | None
    ttl_seconds: int | None = None
    expires_at: str | None = None
    expires_at_time: datetime | None = None
    closed: bool = False
    forked_from: str | None = None
    fork_offset: str | None = None
    fork_sub_offset: int | None = None
    initial: bytes = b""


def normalize(content_type: str | None) -> str:
    if not content_type:
        return ""
    return content_type.split(";")[0].strip().lower()


# The platform's run streams (control_plane/http/stream_views.py, WatchRun): a step of
# seq S ends at `S+1_0`; a delta of the decision step S, at `S_n` between step S-1 and S,
# n ordering it by epoch (a takeover asks again, after the old holder) then by index.
DELTAS_PER_EPOCH = 100_000_000
OFFSET_FORMAT = re.compile(r"^\d{1,19}_\d{1,19}$")


def run_step_offset(seq: int) -> str:
    return f"{seq + 1:016d}_{0:016d}"


def run_delta_offset(seq: int, epoch: int, index: int) -> str:
    return f"{seq:016d}_{epoch * DELTAS_PER_EPOCH + index + 1:016d}"


def run_break_offset(seq: int, epoch: int) -> str:
    """Where the break before a new holder's deltas of decision `seq` ends: after every
    earlier epoch's deltas, before this epoch's first."""
    return f"{seq:016d}_{epoch * DELTAS_PER_EPOCH:016d}"


def offset_parts(offset: str) -> tuple[int, int]:
    high, low = offset.split("_")
    return int(high), int(low)


def offset_after(offset: str, length: int) -> str:
    read_seq, position = (int(part) for part in offset.split("_"))
    return f"{read_seq:016d}_{position + FRAME_BYTES + length:016d}"


# JSON mode: values are kept as JavaScript's JSON.stringify writes them, so that a
# stream reads back byte for byte as the reference server serves it.


def _js_number(value: float | int) -> str:
    if isinstance(value, int) and abs(value) <= 2**53:
        return str(value)
    f = float(value)
    if f != f or f in (float("inf"), float("-inf")):
        return "null"
    if f == int(f) and abs(f) < 1e21:
        return str(int(f))
    text = repr(f)
    if 1e-7 <= abs(f) < 1e21 and "e" in text:
        from decimal import Decimal

        text = format(Decimal(text), "f")
    if "e" in text:
        mantissa, exponent = text.split("e")
        sign = "-" if exponent.startswith("-") else "+"
        text = f"{mantissa}e{sign}{int(exponent.lstrip('+-'))}"
    return text


def _js_string(value: str) -> str:
    try:
        out = json.dumps(value, ensure_ascii=False)
        out.encode()
        return out
    except UnicodeEncodeError:  # a lone surrogate: JavaScript escapes it
        return json.dumps(value)


def js_json(value: Any) -> str:
    """`value` as JSON.stringify writes it (compact, numbers as JavaScript prints them)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return _js_string(value)
    if isinstance(value, int | float):
        return _js_number(value)
    if isinstance(value, list):
        return "[" + ",".join(js_json(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{_js_string(k)}:{js_json(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"not JSON: {type(value).__name__}")


def json_append(data: bytes, initial: bool = False) -> bytes:
    """An append to a JSON stream as it is kept: its values, each followed by a comma
    (an array appends its elements; `[]` is refused but on create)."""
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise StreamRefused(400, "Invalid JSON") from None
    if isinstance(parsed, list):
        if not parsed:
            if initial:
                return b""
            raise StreamRefused(400, "Empty arrays are not allowed")
        return ("".join(js_json(item) + "," for item in parsed)).encode()
    return (js_json(parsed) + ",").encode()


def json_values(messages: list[Message]) -> list[str]:
    """The JSON values of messages, each as kept; a state-protocol change or control
    (`headers.operation` or `headers.control`) gets its message's offset in its headers."""
    values: list[str] = []
    for message in messages:
        text = message.data.decode("utf-8").rstrip()
        if text.endswith(","):
            text = text[:-1]
        if b'"headers"' not in message.data:
            values += [js_json(v) for v in json.loads(f"[{text}]")]
            continue
        for value in json.loads(f"[{text}]"):
            headers = value.get("headers") if isinstance(value, dict) else None
            if isinstance(headers, dict) and (
                isinstance(headers.get("operation"), str) or isinstance(headers.get("control"), str)
            ):
                value = {**value, "headers": {**headers, "offset": message.offset}}
            values.append(js_json(value))
    return values


def body_of(stream: Stream, messages: list[Message]) -> bytes:
    """A catch-up answer's body: the bytes in order, or a JSON stream's values as one array."""
    if stream.is_json:
        return ("[" + ",".join(json_values(messages)) + "]").encode()
    return b"".join(m.data for m in messages)


# Reading and expiring


async def _expire(conn: Connection, row: Any) -> Stream | None:
    """An expired stream: hidden (soft-deleted) while forks read it, else removed."""
    stream = Stream.of(row)
    if stream.ref_count > 0:
        await run(conn, "stream_soft_delete", stream.workspace_id, stream.stream_id)
        return Stream.of({**dict(row), "soft_deleted": True})
    await _remove(conn, stream)
    return None


async def _remove(conn: Connection, stream: Stream) -> None:
    """Remove a stream; a soft-deleted source left with no forks goes with it."""
    await run(conn, "stream_delete", stream.workspace_id, stream.stream_id)
    await run(conn, "stream_wake_all", str(stream.stream_id))
    if stream.forked_from is None:
        return
    source = await run(conn, "stream_ref_add", stream.workspace_id, stream.forked_from, -1)
    if source is not None and source["ref_count"] == 0 and source["soft_deleted"]:
        row = await run(conn, "stream_by_id", stream.workspace_id, stream.forked_from)
        await _remove(conn, Stream.of(row))


async def get(db: Pool, workspace_id: str, path: str) -> Stream | None:
    """The stream at `path` (None: none, or it expired and is now removed)."""
    row = await run(db, "stream_get", workspace_id=workspace_id, path=path)
    if row is None:
        return None
    if not row["expired"]:
        return Stream.of(row)
    async with transaction(db) as conn:
        row = await run(conn, "stream_lock", workspace_id=workspace_id, path=path)
        if row is None:
            return None
        if not row["expired"]:
            return Stream.of(row)
        return await _expire(conn, row)


async def touch(db: Pool, stream: Stream) -> None:
    if stream.ttl_seconds is not None:
        await run(db, "stream_touch", stream.workspace_id, stream.stream_id)


async def _own(db: Pool | Connection, stream: Stream, after: str, cap: str) -> list[Message]:
    rows = await run(
        db,
        "stream_messages_after",
        stream.workspace_id,
        stream.stream_id,
        after,
        cap,
        READ_MESSAGES + 1,
    )
    return [Message(r["end_offset"], bytes(r["data"])) for r in rows]


async def _inherited(db: Pool | Connection, stream: Stream, after: str, cap: str) -> list[Message]:
    """A stream's messages after `after` up to `cap`, its sources' first if it is a fork."""
    messages: list[Message] = []
    if stream.forked_from is not None and stream.fork_offset and after < stream.fork_offset:
        row = await run(db, "stream_by_id", stream.workspace_id, stream.forked_from)
        if row is not None:
            messages += await _inherited(db, Stream.of(row), after, min(stream.fork_offset, cap))
    return messages + await _own(db, stream, after, cap)


async def read(db: Pool | Connection, stream: Stream, after: str) -> tuple[list[Message], bool]:
    """The messages after offset `after` (ZERO: all) and whether they reach the tail."""
    messages = await _inherited(db, stream, after, END)
    kept: list[Message] = []
    size = 0
    for message in messages[:READ_MESSAGES]:
        if kept and size + len(message.data) > READ_BYTES:
            break
        kept.append(message)
        size += len(message.data)
    return kept, len(kept) == len(messages)


# Creating


def _same_config(existing: Stream, source_path: str | None, opts: CreateOptions) -> bool:
    return (
        (normalize(opts.content_type) or "application/octet-stream")
        == (normalize(existing.content_type) or "application/octet-stream")
        and opts.ttl_seconds == existing.ttl_seconds
        and opts.expires_at == existing.expires_at
        and opts.closed == existing.closed
        and opts.forked_from == source_path
        and (opts.fork_offset is None or opts.fork_offset == existing.fork_offset)
        and (opts.fork_sub_offset or 0) == (existing.fork_sub_offset or 0)
    )


async def create(
    db: Pool, workspace_id: str, path: str, opts: CreateOptions
) -> tuple[Stream, bool]:
    """Create the stream (True), or find the same one already there (False); a different
    one there is a 409."""
    async with transaction(db) as conn:
        row = await run(conn, "stream_lock", workspace_id=workspace_id, path=path)
        if row is not None and row["expired"]:
            if await _expire(conn, row) is not None:
                raise StreamRefused(
                    409, "stream was deleted but still has active forks: path cannot be reused"
                )
            row = None
        if row is not None:
            existing = Stream.of(row)
            if existing.soft_deleted:
                raise StreamRefused(
                    409, "stream was deleted but still has active forks: path cannot be reused"
                )
            source_path = None
            if existing.forked_from is not None:
                source = await run(conn, "stream_by_id", workspace_id, existing.forked_from)
                source_path = source["path"] if source is not None else None
            if not _same_config(existing, source_path, opts):
                raise StreamRefused(409, "Stream already exists with different configuration")
            return existing, False
        return await _insert(conn, workspace_id, path, opts), True


@dataclass(frozen=True)
class _Fork:
    """What a fork takes from its source: where it starts, its type, expiry and prefix."""

    source: Stream
    offset: str
    content_type: str | None
    prefix: bytes
    ttl_seconds: int | None
    expires_at: str | None
    expires_at_time: datetime | None


async def _fork_of(conn: Connection, workspace_id: str, opts: CreateOptions) -> _Fork:
    assert opts.forked_from is not None
    row = await run(conn, "stream_lock", workspace_id=workspace_id, path=opts.forked_from)
    if row is None or (row["expired"] and await _expire(conn, row) is None):
        raise StreamRefused(404, "Source stream not found")
    source = Stream.of(row)
    if source.soft_deleted or row["expired"]:
        raise StreamRefused(409, "source stream was deleted but still has active forks")
    if opts.content_type and normalize(opts.content_type) != normalize(source.content_type):
        raise StreamRefused(409, "Content type mismatch with source stream")
    offset = opts.fork_offset or source.tail_offset
    if offset < ZERO or source.tail_offset < offset:
        raise StreamRefused(400, "Fork offset beyond source stream length")
    prefix = b""
    if opts.fork_sub_offset:
        prefix = await _sub_offset_prefix(conn, source, offset, opts.fork_sub_offset)
    ttl, expires, when = opts.ttl_seconds, opts.expires_at, opts.expires_at_time
    if ttl is None and expires is None:  # the source's expiry, unless the fork sets its own
        ttl, expires, when = source.ttl_seconds, source.expires_at, row["expires_at"]
    content_type = opts.content_type or source.content_type
    return _Fork(source, offset, content_type, prefix, ttl, expires, when)


async def _insert(conn: Connection, workspace_id: str, path: str, opts: CreateOptions) -> Stream:
    fork = await _fork_of(conn, workspace_id, opts) if opts.forked_from is not None else None
    row = await run(
        conn,
        "stream_insert",
        workspace_id=workspace_id,
        path=path,
        content_type=fork.content_type if fork else opts.content_type,
        ttl_seconds=fork.ttl_seconds if fork else opts.ttl_seconds,
        expires_at_text=fork.expires_at if fork else opts.expires_at,
        expires_at=fork.expires_at_time if fork else opts.expires_at_time,
        tail_offset=fork.offset if fork else ZERO,
        closed=False,
        forked_from=fork.source.stream_id if fork else None,
        fork_offset=fork.offset if fork else None,
        fork_sub_offset=opts.fork_sub_offset if fork and fork.prefix else None,
    )
    if row is None:
        raise StreamRefused(409, "Stream already exists with different configuration")
    stream = Stream.of(row)
    tail = stream.tail_offset
    if fork is not None:
        await run(conn, "stream_ref_add", workspace_id, fork.source.stream_id, 1)
    chunks = [fork.prefix if fork else b""]
    if opts.initial:
        chunks.append(json_append(opts.initial, initial=True) if stream.is_json else opts.initial)
    for data in (c for c in chunks if c):
        tail = offset_after(tail, len(data))
        await run(conn, "stream_message_insert", workspace_id, stream.stream_id, tail, data)
    if tail == stream.tail_offset and not opts.closed:
        return stream
    await _advance(conn, stream, tail, opts.closed, None, None)
    row = await run(conn, "stream_lock", workspace_id=workspace_id, path=path)
    return Stream.of(row)


async def _sub_offset_prefix(conn: Connection, source: Stream, at: str, sub: int) -> bytes:
    """The first `sub` bytes (JSON: values) of the source's first message after `at`."""
    messages = await _inherited(conn, source, at, END)
    if not messages:
        raise StreamRefused(400, "Invalid fork sub-offset")
    first = messages[0]
    if source.is_json:
        text = first.data.decode().rstrip(",")
        try:
            values = json.loads(f"[{text}]")
        except ValueError:
            raise StreamRefused(400, "Invalid fork sub-offset") from None
        if sub > len(values):
            raise StreamRefused(400, "Invalid fork sub-offset")
        return ("".join(js_json(v) + "," for v in values[:sub])).encode()
    if sub > len(first.data):
        raise StreamRefused(400, "Invalid fork sub-offset")
    return first.data[:sub]


# Appending and closing


async def _locked(conn: Connection, workspace_id: str, path: str) -> Stream:
    row = await run(conn, "stream_lock", workspace_id=workspace_id, path=path)
    if row is None:
        raise not_found()
    if row["expired"]:
        expired = await _expire(conn, row)
        if expired is None:
            raise not_found()
        raise gone()
    stream = Stream.of(row)
    if stream.soft_deleted:
        raise gone()
    return stream


def _same_closer(stream: Stream, producer: Producer | None) -> bool:
    return producer is not None and stream.closed_by == producer.closed()


async def _check_producer(conn: Connection, stream: Stream, p: Producer) -> AppendResult:
    state = await run(
        conn, "stream_producer_get", stream.workspace_id, stream.stream_id, p.producer_id
    )
    if state is None:
        if p.seq != 0:
            return AppendResult("sequence_gap", expected_seq=0, received_seq=p.seq)
        return AppendResult("accepted")
    if p.epoch < state["epoch"]:
        return AppendResult("stale_epoch", current_epoch=state["epoch"])
    if p.epoch > state["epoch"]:
        if p.seq != 0:
            return AppendResult("invalid_epoch_seq")
        return AppendResult("accepted")
    if p.seq <= state["last_seq"]:
        return AppendResult("duplicate", last_seq=state["last_seq"])
    if p.seq == state["last_seq"] + 1:
        return AppendResult("accepted")
    return AppendResult("sequence_gap", expected_seq=state["last_seq"] + 1, received_seq=p.seq)


async def append(
    db: Pool,
    workspace_id: str,
    path: str,
    data: bytes,
    *,
    content_type: str | None,
    seq: str | None = None,
    producer: Producer | None = None,
    close: bool = False,
) -> AppendResult:
    """Append `data` (and close, if `close`): one transaction on the stream's row."""
    async with transaction(db) as conn:
        stream = await _locked(conn, workspace_id, path)
        if stream.closed:
            if _same_closer(stream, producer):
                assert producer is not None
                return AppendResult(
                    "duplicate", stream.tail_offset, closed=True, last_seq=producer.seq
                )
            return AppendResult("stream_closed", stream.tail_offset, closed=True)
        if (
            content_type
            and stream.content_type
            and normalize(content_type) != normalize(stream.content_type)
        ):
            raise StreamRefused(409, "Content-type mismatch")
        if producer is not None:
            checked = await _check_producer(conn, stream, producer)
            if checked.status != "accepted":
                checked.offset = stream.tail_offset
                return checked
        if seq is not None and stream.last_seq is not None and seq <= stream.last_seq:
            raise StreamRefused(409, "Sequence conflict")
        kept = json_append(data) if stream.is_json else data
        tail = offset_after(stream.tail_offset, len(kept))
        await run(conn, "stream_message_insert", workspace_id, stream.stream_id, tail, kept)
        if producer is not None:
            await run(
                conn,
                "stream_producer_put",
                workspace_id,
                stream.stream_id,
                producer.producer_id,
                producer.epoch,
                producer.seq,
            )
        await _advance(conn, stream, tail, close, producer, seq)
        return AppendResult("accepted", tail, closed=close)


async def _advance(
    conn: Connection,
    stream: Stream,
    tail: str,
    close: bool,
    producer: Producer | None,
    seq: str | None,
) -> None:
    closed_by = producer.closed() if close and producer is not None else stream.closed_by
    await run(
        conn,
        "stream_advance",
        workspace_id=stream.workspace_id,
        stream_id=stream.stream_id,
        tail_offset=tail,
        closed=stream.closed or close,
        closed_by=json.dumps(closed_by) if closed_by else None,
        last_seq=seq if seq is not None else stream.last_seq,
    )


async def close(
    db: Pool, workspace_id: str, path: str, producer: Producer | None = None
) -> AppendResult:
    """Close the stream: no more appends; readers at the tail learn it is closed."""
    async with transaction(db) as conn:
        stream = await _locked(conn, workspace_id, path)
        if stream.closed:
            if producer is None:
                return AppendResult("accepted", stream.tail_offset, closed=True)
            if _same_closer(stream, producer):
                return AppendResult(
                    "duplicate", stream.tail_offset, closed=True, last_seq=producer.seq
                )
            return AppendResult("stream_closed", stream.tail_offset, closed=True)
        if producer is not None:
            checked = await _check_producer(conn, stream, producer)
            if checked.status != "accepted":
                checked.offset = stream.tail_offset
                return checked
            await run(
                conn,
                "stream_producer_put",
                workspace_id,
                stream.stream_id,
                producer.producer_id,
                producer.epoch,
                producer.seq,
            )
        await _advance(conn, stream, stream.tail_offset, True, producer, None)
        return AppendResult("accepted", stream.tail_offset, closed=True)


async def delete(db: Pool, workspace_id: str, path: str) -> None:
    """Remove the stream, or hide it while forks still read it."""
    async with transaction(db) as conn:
        row = await run(conn, "stream_lock", workspace_id=workspace_id, path=path)
        if row is None:
            raise not_found()
        stream = Stream.of(row)
        if stream.soft_deleted:
            raise gone()
        if row["expired"]:
            if await _expire(conn, row) is None:
                raise not_found()
            raise gone()
        if stream.ref_count > 0:
            await run(conn, "stream_soft_delete", stream.workspace_id, stream.stream_id)
            await run(conn, "stream_wake_all", str(stream.stream_id))
            return
        await _remove(conn, stream)
