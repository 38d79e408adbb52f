"""The executor's HTTP client: aiohttp sessions, made the way every caller needs them.

Model calls (executor/models/provider_http.py) and HTTP tool calls
(executor/tools/http_tool.py) go through aiohttp: it parses HTTP in C and writes a request
in one go, a third of httpx's CPU per request or less on the executor's call pattern
(issue 16, `python -m bench http`). httpx stays where it must: the MCP SDK is built on it
(executor/tools/mcp_call.py), and so are the control plane's clients.

Every session here:

* is made on first use, inside the running event loop (a session belongs to its loop), and
  closed by its owner's `aclose` (an unclosed one warns when collected);
* keeps idle connections 2 s, below common servers' own keep-alive (uvicorn: 5 s), so a
  request is rarely written to a socket the server is closing;
* verifies TLS the way httpx did: `SSL_CERT_FILE` / `SSL_CERT_DIR` when set, else certifi's
  bundle, read when the session is made (aiohttp's own default is fixed at import);
* follows no redirects (the callers say `allow_redirects=False`);
* honours `HTTP_PROXY` / `HTTPS_PROXY` / `NO_PROXY` (and .netrc) only when the caller
  allows it and a proxy is configured when the session is made: aiohttp then looks the
  proxy up in a thread on every request, a cost not paid when there is none.
"""

from __future__ import annotations

import functools
import json
import os
import ssl
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import certifi
from aiohttp.abc import AbstractResolver

from executor import horizon, storable

# Idle connections are dropped after this many seconds.
KEEPALIVE_SECONDS = 2.0
# What a call that could not be made or read raises (aiohttp's timeouts are TimeoutErrors).
FAILED = (aiohttp.ClientError, TimeoutError)
JSON_TYPE = {"Content-Type": "application/json"}


@dataclass(frozen=True)
class Answer:
    """An answer, read whole."""

    status: int
    headers: Mapping[str, str]  # case-insensitive
    body: bytes
    charset: str | None = None
    reason: str = ""

    def json(self) -> Any:
        """The body as JSON (storable.parse: ValueError for any body that is not)."""
        return storable.parse(self.body)

    @property
    def text(self) -> str:
        """The body decoded as its charset says; as UTF-8 when it names none this Python
        knows (`charset=foo` is the provider's mistake, not a reason to fail the call)."""
        try:
            return self.body.decode(self.charset or "utf-8", errors="replace")
        except LookupError:
            return self.body.decode("utf-8", errors="replace")


async def read(response: aiohttp.ClientResponse) -> Answer:
    """The whole of an aiohttp response."""
    return Answer(
        response.status,
        response.headers,
        await response.read(),
        response.charset,
        response.reason or "",
    )


def encoded(body: Any) -> bytes:
    """A JSON body as httpx wrote it: compact, UTF-8, no NaN (ValueError)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def timeout(seconds: float) -> aiohttp.ClientTimeout:
    """httpx's `Timeout(seconds)` in aiohttp's terms: waiting for a pooled connection and
    connecting within `seconds`, and no more than `seconds` without a byte of the answer
    (counted from before the request is written). No bound on the whole exchange, so a
    stream that keeps coming is not cut."""
    return aiohttp.ClientTimeout(total=None, connect=seconds, sock_read=seconds)


class LastMoment(aiohttp.ClientRequest):
    """Writes a request only if the run may send this instant: the send horizon's
    last-moment check (executor/horizon.py), on the connection, right before the first byte
    goes out. Refused, nothing is written and horizon.Refused is raised (our own side held
    it back: never a tool's outcome), so a holder stopped past its horizon never sends what
    its successor sends. Model and tool requests alike."""

    async def send(self, conn: Any) -> aiohttp.ClientResponse:
        if (refusal := horizon.blocked_now()) is not None:
            raise horizon.Refused(f"not sent: {refusal}")
        return await super().send(conn)


def tls_context() -> ssl.SSLContext:
    """A verifying TLS context, trusting what httpx trusted (loaded once per setting)."""
    return _tls_context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


@functools.lru_cache(maxsize=4)
def _tls_context(cafile: str | None, capath: str | None) -> ssl.SSLContext:
    if cafile:
        return ssl.create_default_context(cafile=cafile)
    if capath:
        return ssl.create_default_context(capath=capath)
    return ssl.create_default_context(cafile=certifi.where())


class LazySession:
    """One ClientSession (and its keep-alive pool), made on first use.

    `resolver`: makes the connector's (netguard.GuardedResolver for workspaces' URLs; it is
    then asked at every new connection, no DNS cache). `request_class`: what writes a request
    (http_tool's carries the send horizon's last-moment check). `retry_writes`: whether
    aiohttp may send an idempotent method (GET, PUT, DELETE...) again on its own when the
    connection breaks; the tool client says no: whether a broken call may have been applied
    is its caller's to decide (executor/tools/delivery.py). `connections`: the most open at
    once (0: no limit); a request past it waits for one, and that wait counts against the
    connect timeout.
    """

    def __init__(
        self,
        seconds: float,
        *,
        connections: int = 100,
        resolver: Callable[[], AbstractResolver] | None = None,
        request_class: type[aiohttp.ClientRequest] = aiohttp.ClientRequest,
        retry_writes: bool = True,
        use_env_proxy: bool = True,
    ) -> None:
        self._seconds = seconds
        self._resolver = resolver
        self._request_class = request_class
        self._retry = retry_writes
        self._env_proxy = use_env_proxy
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None

    def get(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = self._make()
        return self._session

    def _make(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=self._connections,
            keepalive_timeout=KEEPALIVE_SECONDS,
            ssl=tls_context(),
            resolver=self._resolver() if self._resolver is not None else None,
            use_dns_cache=self._resolver is None,
        )
        session = aiohttp.ClientSession(
            connector=connector,
            timeout=timeout(self._seconds),
            request_class=self._request_class,
            trust_env=self._env_proxy and bool(urllib.request.getproxies()),
            # No cookie jar: a cookie one workspace's call was given must never ride along
            # on another's (httpx kept them per client).
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        if not self._retry:
            # aiohttp 3.14.5 (pinned) keeps this switch private; it resends GET, PUT, DELETE
            # once on a broken connection when set.
            session._retry_connection = False  # noqa: SLF001
        return session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
