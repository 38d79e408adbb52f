"""A TCP proxy that can black-hole its connections (half-open: nothing forwarded either
way, no socket closed, no RST) and heal them, in the test's own event loop.

Black-holed, it stops moving bytes: what each side writes stays buffered (as a real
partition leaves it to TCP retransmission), new connections are accepted and then hang
too. Healed, everything buffered flows again in order, as after a partition heals.
"""

from __future__ import annotations

import asyncio
import contextlib

CHUNK = 64 * 1024


class TcpProxy:
    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.connections = 0

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    @property
    def address(self) -> str:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    def black_hole(self) -> None:
        """Stop forwarding in both directions; keep every socket open."""
        self._flowing.clear()

    def heal(self) -> None:
        self._flowing.set()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for writer in list(self._writers):
            writer.close()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            upstream_r, upstream_w = await asyncio.open_connection(*self._target)
        except OSError:
            client_w.close()
            return
        self._writers |= {client_w, upstream_w}
        for reader, writer in ((client_r, upstream_w), (upstream_r, client_w)):
            task = asyncio.create_task(self._pump(reader, writer))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await self._flowing.wait()
                data = await reader.read(CHUNK)
                if not data:
                    break
                await self._flowing.wait()  # read just before the black hole: held back too
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()
