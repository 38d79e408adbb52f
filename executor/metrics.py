"""The executor's Prometheus metrics and the small HTTP listener that serves them.

Off unless `AGENTRUN_METRICS_LISTEN` names an address (`127.0.0.1:9464`; port 0 takes a
free one, written to `AGENTRUN_METRICS_PORT_FILE`). `GET /metrics` answers in the
Prometheus text format; with `AGENTRUN_METRICS_TOKEN` set it needs
`authorization: Bearer <token>`. The executor's figures carry no workspace labels
(providers and wait reasons only), so a private address is enough for most fleets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

from telemetry.scrape import LATENCY_BUCKETS, token_matches

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)

RUNS_HELD = Gauge("agentrun_executor_runs_held", "Runs this executor holds now", registry=REGISTRY)
ASSIGNMENTS = Counter(
    "agentrun_executor_assignments", "Runs assigned to this executor", registry=REGISTRY
)
RELEASED = Counter(
    "agentrun_executor_runs_released",
    "Holds that ended, by how (completed, failed, parked, fenced, crashed, invalid, done)",
    ["how"],
    registry=REGISTRY,
)
COMMIT_SECONDS = Histogram(
    "agentrun_executor_commit_seconds",
    "Round trip of one Commit to the control plane, by outcome (ok, fenced, invalid, unavailable)",
    ["outcome"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
PARKS = Counter(
    "agentrun_executor_parks",
    "Runs this executor parked, by wait reason",
    ["reason"],
    registry=REGISTRY,
)
FENCED = Counter(
    "agentrun_executor_fenced",
    "Runs this executor stopped because it lost their lease (it wrote nothing more)",
    registry=REGISTRY,
)
RATE_TOKENS = Counter(
    "agentrun_executor_rate_limit",
    "Provider requests by what the rate limiter said: granted, empty (parked for a token), "
    "429 (the provider refused), unavailable (Redis could not be asked)",
    ["provider", "outcome"],
    registry=REGISTRY,
)
MODEL_CALLS = Counter(
    "agentrun_executor_model_calls",
    "Model calls, by outcome (ok, unavailable, rejected)",
    ["outcome"],
    registry=REGISTRY,
)

OUTCOMES = {0: "unspecified", 1: "ok", 2: "fenced", 3: "invalid", 4: "unavailable"}


def _authorized(token: str | None, header: str) -> bool:
    if not token:
        return True
    scheme, _, offered = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return token_matches(token, offered.strip())


def _write_port_file(path: str, port: int) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.replace(tmp, path)


class MetricsListener:
    """`GET /metrics` over plain HTTP/1.1 on its own port (one request per connection)."""

    def __init__(
        self,
        listen: str,
        token: str | None = None,
        render: Callable[[], bytes] = lambda: generate_latest(REGISTRY),
    ) -> None:
        host, _, port = listen.rpartition(":")
        self._host, self._port = host or "127.0.0.1", int(port)
        self._token = token
        self._render = render
        self._server: asyncio.Server | None = None

    @classmethod
    def from_env(cls) -> MetricsListener | None:
        listen = os.environ.get("AGENTRUN_METRICS_LISTEN")
        return cls(listen, os.environ.get("AGENTRUN_METRICS_TOKEN") or None) if listen else None

    @property
    def port(self) -> int:
        assert self._server is not None and self._server.sockets
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, self._host, self._port)
        if port_file := os.environ.get("AGENTRUN_METRICS_PORT_FILE"):
            _write_port_file(port_file, self.port)
        log.info("metrics on http://%s:%d/metrics", self._host, self.port)
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            status, body, kind = await asyncio.wait_for(self._answer(reader), 5.0)
        except (TimeoutError, ValueError, asyncio.IncompleteReadError, ConnectionError):
            status, body, kind = "400 Bad Request", b"bad request\n", "text/plain"
        head = (
            f"HTTP/1.1 {status}\r\ncontent-type: {kind}\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        with contextlib.suppress(ConnectionError):
            writer.write(head.encode() + body)
            await writer.drain()
        writer.close()

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[str, bytes, str]:
        request = await reader.readuntil(b"\r\n\r\n")
        lines = request.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
        auth = next((v for k, v in headers.items() if k.strip().lower() == "authorization"), "")
        if method != "GET" or path.split("?", 1)[0] != "/metrics":
            return "404 Not Found", b"only GET /metrics here\n", "text/plain"
        if not _authorized(self._token, auth):
            return "401 Unauthorized", b"a bearer token is required\n", "text/plain"
        return "200 OK", self._render(), CONTENT_TYPE_LATEST


__all__ = ["REGISTRY", "MetricsListener"]
