"""Run a sandbox app with uvicorn on a given or free port, quietly, and announce the port.

Port 0 is resolved by binding the socket here, so the real port is known
before uvicorn starts; it is written to the port file (atomically) only once
the server accepts connections, so a parent process can poll for that file.
"""

import asyncio
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import uvicorn
from starlette.types import ASGIApp

from sandbox.faults import ConnectionDropped

# Long enough for in-flight replies, short enough that a hanging dropped
# response does not hold up shutdown.
GRACEFUL_SHUTDOWN_SECONDS = 1.0


class _QuietDrops(logging.Filter):
    """Keeps tracebacks of deliberately dropped responses out of uvicorn's error log,
    and of hanging ones that a shutdown cancels."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, ConnectionDropped | asyncio.CancelledError)


_QUIET_DROPS = _QuietDrops()  # one instance: addFilter ignores a filter already added


class _Server(uvicorn.Server):
    """A uvicorn server that calls back once its sockets accept connections."""

    def __init__(self, config: uvicorn.Config, on_started: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_started = on_started

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self._on_started()


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # Name the protocol: asyncio turns on TCP_NODELAY only for sockets whose proto
    # is IPPROTO_TCP, and without it every keep-alive request waits ~40 ms on Nagle.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def write_port_file(path: Path, port: int) -> None:
    """Write the port so a reader never sees a partial file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{port}\n", encoding="utf-8")
    os.replace(tmp, path)


def _server(app: ASGIApp, on_started: Callable[[], None]) -> _Server:
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,  # benchmarks send thousands of requests
        lifespan="off",
        timeout_graceful_shutdown=int(GRACEFUL_SHUTDOWN_SECONDS),
    )
    logging.getLogger("uvicorn.error").addFilter(_QUIET_DROPS)
    return _Server(config, on_started)


async def serve(app: ASGIApp, host: str, port: int, port_file: Path | None = None) -> None:
    """Serve until SIGTERM/SIGINT (uvicorn handles both in the main thread)."""
    sock = bind_socket(host, port)
    actual_port = sock.getsockname()[1]

    def announce() -> None:
        if port_file is not None:
            write_port_file(port_file, actual_port)
        print(f"sandbox listening on http://{host}:{actual_port}", file=sys.stderr, flush=True)

    try:
        await _server(app, announce).serve(sockets=[sock])
    finally:
        sock.close()


def run(app: ASGIApp, host: str, port: int, port_file: Path | None = None) -> None:
    """Blocking entry point: serve, and exit with status 0 on SIGTERM or SIGINT."""
    # uvicorn re-raises the signal it caught after its graceful shutdown; with
    # these handlers that ends the process cleanly instead of by the signal.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _exit_cleanly)
    asyncio.run(serve(app, host, port, port_file))


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


class BackgroundServer:
    """A sandbox app served from a thread of this process (for in-process use)."""

    def __init__(self, app: ASGIApp, host: str = "127.0.0.1", port: int = 0) -> None:
        self._sock = bind_socket(host, port)
        self.host, self.port = host, self._sock.getsockname()[1]
        self._started = threading.Event()
        self._server = _server(app, self._started.set)
        self._thread = threading.Thread(target=self._run, name=f"sandbox:{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 10.0) -> "BackgroundServer":
        self._thread.start()
        if not self._started.wait(timeout):
            self.stop()
            raise RuntimeError(f"sandbox server did not start within {timeout}s")
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join()
        self._sock.close()

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self) -> None:
        asyncio.run(self._server.serve(sockets=[self._sock]))
