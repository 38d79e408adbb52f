"""A lean Redis client for the token-bucket script: one pipelined connection, RESP2 replies.

Why not redis-py here: a take is one EVALSHA, and redis-py spends ~100 µs of CPU on it
(connection pool, command packing, retry and observability layers, a timeout context per
read) where the round trip itself costs ~20 µs; every tool call takes a token. This
client sends commands on a single connection shared by all callers and matches replies to
callers in order (Redis answers a connection's commands in order). The commands asked for
in one turn of the event loop leave in one write at its end: many runs' tool calls start in
the same turn (the commit results that let them go arrive together), and on loopback a
write costs the sender its receiver's wake-up too.

Failure is all or nothing, as the limiter needs it: a timeout, a reset or a reply that
cannot be parsed closes the connection and fails every command waiting on it (their
outcome is unknown: a take may have been spent, never granted twice); the next command
connects again. Only `redis://` and `unix://` URLs (user, password, db) are served here;
TLS (`rediss://`) stays with redis-py (token_bucket.TokenBuckets picks).
"""

from __future__ import annotations

import asyncio
import collections
from urllib.parse import unquote, urlsplit

SCHEMES = frozenset({"redis", "unix"})


class RespError(Exception):
    """Redis answered with an error reply (e.g. `NOSCRIPT ...`)."""


class RedisUnavailable(ConnectionError):
    """No answer: the connection failed, timed out or was closed."""


def encode(*parts: str | bytes | int | float) -> bytes:
    """One command as a RESP array of bulk strings."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        if isinstance(part, bytes):
            data = part
        elif isinstance(part, str):
            data = part.encode()
        else:
            data = repr(part).encode()  # ints and floats as redis-py sends them
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


_INCOMPLETE = object()


def parse(buf: bytearray | bytes, pos: int = 0) -> tuple[object, int]:
    """One reply starting at `pos`: (value, next position), or (_INCOMPLETE, pos).
    An error reply's value is a RespError (returned, not raised)."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        return _INCOMPLETE, pos
    kind, line = buf[pos : pos + 1], bytes(buf[pos + 1 : end])
    after = end + 2
    if kind == b"+":
        return line.decode(), after
    if kind == b"-":
        return RespError(line.decode(errors="replace")), after
    if kind == b":":
        return int(line), after
    if kind == b"$":
        return _bulk(buf, pos, after, int(line))
    if kind == b"*":
        return _array(buf, pos, after, int(line))
    raise ValueError(f"unexpected RESP reply type {kind!r}")


def _bulk(buf: bytearray | bytes, pos: int, after: int, size: int) -> tuple[object, int]:
    if size < 0:
        return None, after
    if len(buf) < after + size + 2:
        return _INCOMPLETE, pos
    return bytes(buf[after : after + size]), after + size + 2


def _array(buf: bytearray | bytes, pos: int, after: int, count: int) -> tuple[object, int]:
    if count < 0:
        return None, after
    items: list[object] = []
    for _ in range(count):
        item, after = parse(buf, after)
        if item is _INCOMPLETE:
            return _INCOMPLETE, pos
        items.append(item)
    return items, after


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiting: collections.deque[asyncio.Future[object]] = collections.deque()
        self._buf = bytearray()
        self._outgoing: list[bytes] = []  # commands of this turn of the loop, not written yet
        self.closed = False

    def send_soon(self, data: bytes) -> None:
        """Queue a command; the turn's commands are written together at its end."""
        if not self._outgoing:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outgoing.append(data)

    def _flush(self) -> None:
        data, self._outgoing = b"".join(self._outgoing), []
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport

    def data_received(self, data: bytes) -> None:
        self._buf += data
        pos = 0
        try:
            while pos < len(self._buf):
                value, pos_after = parse(self._buf, pos)
                if value is _INCOMPLETE:
                    break
                pos = pos_after
                if not self.waiting:
                    raise ValueError("a reply nobody asked for")
                future = self.waiting.popleft()
                if not future.done():
                    future.set_result(value)
        except ValueError:
            self.close()
            return
        del self._buf[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail_all()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
        self._fail_all()

    def _fail_all(self) -> None:
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(RedisUnavailable("connection lost"))


class RespClient:
    """Commands on one shared connection, connected on first use and again after a loss."""

    def __init__(self, url: str, timeout: float) -> None:
        parts = urlsplit(url)
        if parts.scheme not in SCHEMES:
            raise ValueError(f"unsupported Redis URL scheme {parts.scheme!r}")
        self._unix = parts.path if parts.scheme == "unix" else None
        self._host, self._port = parts.hostname or "localhost", parts.port or 6379
        self._username = unquote(parts.username) if parts.username else None
        self._password = unquote(parts.password) if parts.password else None
        db = parts.path.lstrip("/") if parts.scheme == "redis" else ""
        query = dict(p.split("=", 1) for p in parts.query.split("&") if "=" in p)
        self._db = int(db or query.get("db", "0") or 0)
        self._timeout = timeout
        self._conn: _Protocol | None = None
        self._connecting = asyncio.Lock()

    async def command(self, *parts: str | bytes | int | float) -> object:
        """Send one command, return its reply (a RespError value raises it)."""
        return await self._checked(await self._connection(), *parts)

    async def evalsha(self, sha: str, numkeys: int, *keys_and_args: str | float) -> object:
        """EVALSHA, called as redis-py's client is (token_bucket.TokenBuckets uses either)."""
        return await self.command("EVALSHA", sha, numkeys, *keys_and_args)

    async def script_load(self, script: str) -> object:
        """SCRIPT LOAD, as redis-py's: the script's SHA1."""
        return await self.command("SCRIPT", "LOAD", script)

    async def aclose(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def _send(self, conn: _Protocol, data: bytes) -> object:
        if conn.closed:  # lost since it was handed out: its replies will never come
            raise RedisUnavailable("connection lost")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[object] = loop.create_future()
        conn.waiting.append(future)
        conn.send_soon(data)
        timer = loop.call_later(self._timeout, _expire, conn, future)
        try:
            return await future
        finally:
            timer.cancel()

    async def _connection(self) -> _Protocol:
        conn = self._conn
        if conn is not None and not conn.closed:
            return conn
        async with self._connecting:
            if self._conn is None or self._conn.closed:
                self._conn = await asyncio.wait_for(self._open(), self._timeout)
            return self._conn

    async def _open(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        if self._unix is not None:
            _, conn = await loop.create_unix_connection(_Protocol, self._unix)
        else:
            _, conn = await loop.create_connection(_Protocol, self._host, self._port)
        try:
            if self._password is not None:
                auth = [self._username, self._password] if self._username else [self._password]
                await self._checked(conn, "AUTH", *auth)
            if self._db:
                await self._checked(conn, "SELECT", self._db)
        except BaseException:
            conn.close()
            raise
        return conn

    async def _checked(self, conn: _Protocol, *parts: str | bytes | int | float) -> object:
        """One command on `conn`: its reply (a RespError value raises it)."""
        reply = await self._send(conn, encode(*parts))
        if isinstance(reply, RespError):
            raise reply
        return reply


def _expire(conn: _Protocol, future: asyncio.Future[object]) -> None:
    """No reply in time: the connection's order of replies can no longer be trusted."""
    if not future.done():
        future.set_exception(RedisUnavailable("no reply in time"))
        conn.close()
