"""A scripted HTTP/1.1 server on a real socket, served by the test's own event loop: what the
executor's HTTP client really sends, and answers or faults as the test scripts them.

An item a handler returns: a `Reply`, or a fault played on the real connection:
`DROP` (read the request, close unanswered: a reset after the write), `STALL` (read the
request, never answer: the client's read timeout fires), `CUT` (announce a body, send part
of it, close). `Stub(refusing=True)` holds its port bound but not listening (connections are
refused) until `listen()`; `full_backlog()` gives a port whose connections never complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import json as jsonlib
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from multidict import CIMultiDict

DROP, STALL, CUT = "drop", "stall", "cut"


@dataclass(frozen=True)
class Seen:
    """One request as it arrived."""

    method: str
    target: str  # path and query, as written
    headers: CIMultiDict[str]
    body: bytes

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    @property
    def query(self) -> dict[str, str]:
        return dict(parse_qsl(self.target.partition("?")[2]))

    def json(self) -> Any:
        return jsonlib.loads(self.body)


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)

    def encoded(self) -> bytes:
        head = [f"HTTP/1.1 {self.status} Scripted", f"Content-Length: {len(self.body)}"]
        head += [f"{k}: {v}" for k, v in self.headers.items()]
        return ("\r\n".join(head) + "\r\n\r\n").encode() + self.body


def reply(
    status: int = 200,
    json: Any = None,
    *,
    text: str | None = None,
    content: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> Reply:
    """An answer: `json` (the default), `text` or raw `content`."""
    extra = dict(headers or {})
    if content is not None:
        body = content
    elif text is not None:
        body = text.encode()
        extra.setdefault("Content-Type", "text/plain; charset=utf-8")
    else:
        body = jsonlib.dumps(json).encode()
        extra.setdefault("Content-Type", "application/json")
    return Reply(status, body, extra)


Handler = Callable[[Seen], Any]


def scripted(scripts: dict[str, list[Any]]) -> Handler:
    """Each path answers with its next item; the last one repeats."""
    left = {path: list(items) for path, items in scripts.items()}

    def handler(seen: Seen) -> Any:
        script = left[seen.path]
        return script.pop(0) if len(script) > 1 else script[0]

    return handler


class Stub:
    def __init__(self, handler: Handler, *, refusing: bool = False) -> None:
        self._handler = handler
        self._refusing = refusing
        self.seen: list[Seen] = []
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def of(self, path: str) -> list[Seen]:
        return [s for s in self.seen if s.path == path]

    async def listen(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, sock=self._sock)

    async def __aenter__(self) -> Stub:
        if not self._refusing:
            await self.listen()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        self._sock.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while await self._exchange(reader, writer):
                pass
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers: CIMultiDict[str] = CIMultiDict()
        for line in filter(None, lines[1:]):
            name, _, value = line.partition(":")
            headers.add(name.strip(), value.strip())
        length = int(headers.get("Content-Length", "0"))
        body = await reader.readexactly(length) if length else b""
        seen = Seen(method, target, headers, body)
        self.seen.append(seen)
        item = self._handler(seen)
        if asyncio.iscoroutine(item):
            item = await item
        if item == DROP:
            return False
        if item == STALL:
            await asyncio.Event().wait()
        if item == CUT:
            writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"partial":')
            await writer.drain()
            return False
        writer.write(item.encoded())
        await writer.drain()
        return True


@contextlib.asynccontextmanager
async def serving(handler: Handler, *, refusing: bool = False) -> AsyncIterator[Stub]:
    async with Stub(handler, refusing=refusing) as stub:
        yield stub


@contextlib.contextmanager
def full_backlog() -> Iterator[str]:
    """The URL of a port whose accept queue is full: a new connection never completes (the
    kernel drops its SYN), so the client's connect timeout fires."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for sock in [*fillers, listener]:
            sock.close()
