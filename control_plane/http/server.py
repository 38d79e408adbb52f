"""Serves the ingress app with uvicorn inside the control plane's event loop.

The socket is bound before uvicorn starts, so port 0 resolves to a real port
that `port` reports (and the control plane writes to its HTTP port file).
Signals stay with the control plane: it stops the ingress as part of its own
graceful stop, after the gRPC server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator

import uvicorn
from starlette.types import ASGIApp

log = logging.getLogger(__name__)

GRACEFUL_SHUTDOWN_SECONDS = 5.0


class _EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to its host and says when it serves."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.serving = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self.serving.set()


def _bind(listen: str) -> socket.socket:
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP so asyncio sets TCP_NODELAY (no Nagle delay on keep-alive replies).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
    except (OSError, ValueError) as exc:
        sock.close()
        raise SystemExit(f"cannot listen for HTTP on {listen}: {exc}") from None
    return sock


class HttpIngress:
    """The running HTTP server: `await start()`, `port`, `await stop()`."""

    def __init__(self, app: ASGIApp, listen: str, tls: tuple[str, str] | None = None) -> None:
        """`tls` is (certificate, key) PEM files: then the port speaks HTTPS only."""
        self.app = app
        self._sock = _bind(listen)
        self.port: int = self._sock.getsockname()[1]
        cert, key = tls if tls is not None else (None, None)
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=int(GRACEFUL_SHUTDOWN_SECONDS),
            ssl_certfile=cert,
            ssl_keyfile=key,
        )
        self._server = _EmbeddedServer(config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Serve in the background; returns once the socket accepts connections."""
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]), name="http")
        serving = asyncio.create_task(self._server.serving.wait())
        await asyncio.wait({self._task, serving}, return_when=asyncio.FIRST_COMPLETED)
        if not serving.done():
            serving.cancel()
            self._task.result()  # raises what stopped it
            raise RuntimeError("the HTTP ingress stopped while starting")

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._sock.close()
