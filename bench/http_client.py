"""HTTP client cost: CPU per request and requests/s for the executor's call pattern.

Issue 16: "keep httpx unless a maintained client measures markedly cheaper". aiohttp did
(0.34x / 0.14x at concurrency 1 / 32), and the executor now makes its model and HTTP tool
calls with it (executor/http_session.py); httpx is kept here as the baseline. The servers are
the real sandbox model and providers servers (uvicorn, their own processes, as in bench e2e).
Each of C workers on ONE event loop (the executor's: telemetry/event_loop.py, uvloop where
installed) makes what a `steps10` run's action is, over and over: a model call (POST
/v1/chat/completions with the conversation and the echo tool schema the executor sends, its
X-Agentrun-Run-Id/Seq headers, the JSON answer parsed), then a tool call (POST /echo with
Idempotency-Key and Accept headers, the JSON answer parsed), over keep-alive connections,
at concurrency 1 and 32 (an executor's capacity). The clients:

  * the executor's: its own classes, as a worker builds them (ProviderHttp of
    executor/models/provider_http.py for the model call, HttpToolClient of
    executor/tools/http_tool.py sending the catalogue's `echo` tool): aiohttp underneath,
    with what the executor adds (the send horizon's request class, error classes, the
    answer read whole).
  * httpx: as the executor built it before the switch (the model's client and the tools'):
    one AsyncClient per side, Timeout(60),
    Limits(keepalive_expiry=2.0) (httpx's default pool: 100 connections, 20 kept alive),
    no redirects; the model call is `post(json=..., timeout=...)`, the tool call
    `build_request` + `send`, as there.
  * aiohttp, bare: one ClientSession per side, keep-alive 2 s, `post(json=...)` + `json()`.
  * pyreqwest, a candidate: Rust's reqwest (hyper, tokio) behind a Python async API, a
    maintained client (bench extra), one Client for both sides, the same timeout, idle
    connections kept 2 s, no redirects; bodies written with json.dumps, answers read whole.
    Not the executor's: measured so the next switch is decided on figures.
  * raw: the floor, a minimal HTTP/1.1 keep-alive client on asyncio.Protocol (one write a
    request, Content-Length bodies only, a list of idle connections) with json.dumps/loads:
    what any client must spend here. Not a candidate: no chunked bodies, redirects, TLS,
    timeouts or pool limits.

Blocks of each client alternate (the order reversed every round) so the other tenants' load
falls on all alike. CPU is this process's (user + system, all threads) over the timed
blocks; the sandbox servers' CPU is shown apart (the same work for every client).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from bench import report
from bench.cpu import process_cpu
from bench.procs import Procs, workdir
from bench.services import module_available, start_sandbox
from bench.stats import ratio
from executor.http_session import JSON_TYPE
from executor.tools.catalogue import Catalogue
from telemetry import event_loop

CONCURRENCY = (1, 32)
TIMEOUT = 60.0
KEEPALIVE = 2.0  # the executor's keepalive_expiry
MARKEDLY = 0.7  # "markedly cheaper": at most this much httpx's CPU per request, at both
MODEL = "steps10"
TOOLS = Catalogue.load().openai_tools(["echo"])
EXECUTOR = "the executor's (aiohttp)"
HTTPX = "httpx (the executor's former settings)"
AIOHTTP = "aiohttp, bare"
REQWEST = "pyreqwest (a candidate)"
RAW = "raw asyncio (floor)"


def model_body() -> dict[str, Any]:
    """The first model request of a steps10 run, as the executor sends it."""
    messages = [
        {"role": "system", "content": "benchmark"},
        {"role": "user", "content": f"benchmark run {uuid.uuid4().hex[:6]}"},
    ]
    return {"model": MODEL, "messages": messages, "tools": TOOLS}


@dataclass(frozen=True)
class Targets:
    model_url: str  # .../v1/chat/completions
    echo_url: str  # .../echo


class Client:
    """One side's pair of calls; `close()` when done."""

    name = ""

    async def model(self, body: dict[str, Any], run_id: str, seq: int) -> Any:
        raise NotImplementedError

    async def echo(self, arguments: dict[str, Any], key: str) -> Any:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


def httpx_async_client() -> httpx.AsyncClient:
    """An AsyncClient with the executor's settings (provider_http.py, http_tool.py)."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(TIMEOUT),
        limits=httpx.Limits(keepalive_expiry=KEEPALIVE),
        follow_redirects=False,
    )


class HttpxClient(Client):
    name = HTTPX

    def __init__(self, targets: Targets) -> None:
        self._t = targets
        self._model, self._tools = httpx_async_client(), httpx_async_client()

    async def model(self, body: dict[str, Any], run_id: str, seq: int) -> Any:
        headers = {"X-Agentrun-Run-Id": run_id, "X-Agentrun-Seq": str(seq)}
        response = await self._model.post(
            self._t.model_url, json=body, headers=dict(headers), timeout=httpx.Timeout(TIMEOUT)
        )
        response.raise_for_status()
        return response.json()

    async def echo(self, arguments: dict[str, Any], key: str) -> Any:
        headers = {"Idempotency-Key": key, "Accept": "application/json"}
        request = self._tools.build_request(
            "POST", self._t.echo_url, json=dict(arguments), headers=headers
        )
        response = await self._tools.send(request)
        response.raise_for_status()
        return response.json()

    async def close(self) -> None:
        await self._model.aclose()
        await self._tools.aclose()


class AiohttpClient(Client):
    name = AIOHTTP

    def __init__(self, targets: Targets) -> None:
        import aiohttp  # optional: only this client needs it

        self._t = targets
        self._timeout = aiohttp.ClientTimeout(total=TIMEOUT)

        def session() -> aiohttp.ClientSession:
            connector = aiohttp.TCPConnector(limit=100, keepalive_timeout=KEEPALIVE)
            return aiohttp.ClientSession(connector=connector, timeout=self._timeout)

        self._model, self._tools = session(), session()

    async def model(self, body: dict[str, Any], run_id: str, seq: int) -> Any:
        headers = {"X-Agentrun-Run-Id": run_id, "X-Agentrun-Seq": str(seq)}
        async with self._model.post(self._t.model_url, json=body, headers=headers) as response:
            response.raise_for_status()
            return await response.json()

    async def echo(self, arguments: dict[str, Any], key: str) -> Any:
        headers = {"Idempotency-Key": key, "Accept": "application/json"}
        async with self._tools.post(self._t.echo_url, json=arguments, headers=headers) as r:
            r.raise_for_status()
            return await r.json()

    async def close(self) -> None:
        await self._model.close()
        await self._tools.close()


class ReqwestClient(Client):
    name = REQWEST

    def __init__(self, targets: Targets) -> None:
        from datetime import timedelta

        from pyreqwest.client import ClientBuilder  # optional: only this client needs it

        self._t = targets
        self._client = (
            ClientBuilder()
            .timeout(timedelta(seconds=TIMEOUT))
            .follow_redirects(False)
            .pool_idle_timeout(timedelta(seconds=KEEPALIVE))
            .build()
        )

    async def _post(self, url: str, body: Any, headers: dict[str, str]) -> Any:
        request = self._client.post(url).headers({**headers, **JSON_TYPE})
        response = await request.body_bytes(json.dumps(body).encode()).build().send()
        if response.status >= 400:
            raise RuntimeError(f"pyreqwest: HTTP {response.status}")
        return json.loads(bytes(await response.bytes()))

    async def model(self, body: dict[str, Any], run_id: str, seq: int) -> Any:
        headers = {"X-Agentrun-Run-Id": run_id, "X-Agentrun-Seq": str(seq)}
        return await self._post(self._t.model_url, body, headers)

    async def echo(self, arguments: dict[str, Any], key: str) -> Any:
        headers = {"Idempotency-Key": key, "Accept": "application/json"}
        return await self._post(self._t.echo_url, arguments, headers)

    async def close(self) -> None:
        await self._client.close()


class ExecutorClient(Client):
    """The executor's own client classes, built as executor/worker.py builds them."""

    name = EXECUTOR

    def __init__(self, targets: Targets) -> None:
        from executor.config import ExecutorConfig
        from executor.models.provider_http import ProviderHttp
        from executor.tools.http_tool import HttpToolClient

        self._t = targets
        self._model = ProviderHttp(TIMEOUT, "")
        base = targets.echo_url.rsplit("/echo", 1)[0]
        self._tools = HttpToolClient(
            ExecutorConfig(providers_url=base, tool_timeout_seconds=TIMEOUT)
        )
        self._echo = Catalogue.load().get("echo")

    async def model(self, body: dict[str, Any], run_id: str, seq: int) -> Any:
        headers = {"X-Agentrun-Run-Id": run_id, "X-Agentrun-Seq": str(seq)}
        return (await self._model.post(self._t.model_url, body, headers)).json()

    async def echo(self, arguments: dict[str, Any], key: str) -> Any:
        return await self._tools.send(self._echo, arguments, key)

    async def close(self) -> None:
        await self._model.aclose()
        await self._tools.aclose()


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection: one request at a time, Content-Length answers."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.open = True
        self._buffer = bytearray()
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionError("the server closed the connection"))

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        waiter = self._waiter
        if waiter is not None and not waiter.done() and (answer := self._answer()) is not None:
            waiter.set_result(answer)

    def _answer(self) -> tuple[int, bytes] | None:
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            return None
        head = bytes(self._buffer[:end]).lower()
        at = head.find(b"\r\ncontent-length:")
        if at < 0:
            raise ValueError("the raw client reads Content-Length answers only")
        stop = head.find(b"\r\n", at + 17)
        length = int(head[at + 17 : stop if stop >= 0 else len(head)])
        total = end + 4 + length
        if len(self._buffer) < total:
            return None
        body = bytes(self._buffer[end + 4 : total])
        del self._buffer[:total]
        if b"\r\nconnection: close" in head:
            self.open = False
        return int(head[9:12]), body

    async def exchange(self, request: bytes) -> tuple[int, bytes]:
        assert self.transport is not None
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return await self._waiter


class RawClient(Client):
    name = RAW

    def __init__(self, targets: Targets) -> None:
        self._t = targets
        # Idle connections with when they went idle; dropped after KEEPALIVE, as the others.
        self._idle: dict[tuple[str, int], list[tuple[_Connection, float]]] = {}

    async def _post(self, url: str, body: Any, headers: dict[str, str]) -> Any:
        parts = urlsplit(url)
        address = (parts.hostname or "127.0.0.1", parts.port or 80)
        payload = json.dumps(body).encode()
        lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        head = (
            f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n{lines}"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        )
        idle = self._idle.setdefault(address, [])
        conn = await self._take(idle, address)
        status, answer = await conn.exchange(head.encode() + payload)
        if status >= 400:
            raise RuntimeError(f"raw client: HTTP {status}")
        if conn.open:
            idle.append((conn, time.monotonic()))
        elif conn.transport is not None:
            conn.transport.close()
        return json.loads(answer)

    async def _take(
        self, idle: list[tuple[_Connection, float]], address: tuple[str, int]
    ) -> _Connection:
        now = time.monotonic()
        while idle:
            conn, since = idle.pop()
            assert conn.transport is not None
            if conn.open and not conn.transport.is_closing() and now - since < KEEPALIVE:
                return conn
            conn.transport.close()
        return await self._connect(address)

    @staticmethod
    async def _connect(address: tuple[str, int]) -> _Connection:
        _, conn = await asyncio.get_running_loop().create_connection(_Connection, *address)
        return conn

    async def model(self, body: dict[str, Any], run_id: str, seq: int) -> Any:
        return await self._post(
            self._t.model_url, body, {"X-Agentrun-Run-Id": run_id, "X-Agentrun-Seq": str(seq)}
        )

    async def echo(self, arguments: dict[str, Any], key: str) -> Any:
        headers = {"Idempotency-Key": key, "Accept": "application/json"}
        return await self._post(self._t.echo_url, arguments, headers)

    async def close(self) -> None:
        for conns in self._idle.values():
            for conn, _ in conns:
                if conn.transport is not None:
                    conn.transport.close()
        self._idle.clear()


def clients() -> list[type[Client]]:
    candidates = [ReqwestClient] if module_available("pyreqwest") else []
    return [HttpxClient, ExecutorClient, AiohttpClient, *candidates, RawClient]


async def pairs(client: Client, workers: int, per_worker: int) -> None:
    """`workers` concurrent loops, each `per_worker` times: a model call, then a tool call."""

    async def worker(w: int) -> None:
        run_id = str(uuid.uuid4())
        for i in range(per_worker):
            reply = await client.model(model_body(), run_id, i + 1)
            if not reply["choices"][0]["message"].get("tool_calls"):
                raise RuntimeError(f"{client.name}: the model asked for no tool call")
            answer = await client.echo({"text": f"w{w} {i}"}, f"{run_id}:{i}")
            if "echo" not in answer:
                raise RuntimeError(f"{client.name}: echo answered {answer!r}")

    await asyncio.gather(*(worker(w) for w in range(workers)))


@dataclass
class Tally:
    requests: int = 0
    seconds: float = 0.0
    cpu: float = 0.0  # this process
    sandbox: float = 0.0  # the sandbox servers

    @property
    def per_second(self) -> float:
        return ratio(self.requests, self.seconds)

    def cpu_us(self, which: str = "cpu") -> float:
        return ratio(getattr(self, which), self.requests) * 1e6


@dataclass
class Results:
    """(client name, concurrency) -> what its timed blocks added up to."""

    tallies: dict[tuple[str, int], Tally] = field(default_factory=dict)

    def of(self, name: str, concurrency: int) -> Tally:
        return self.tallies.setdefault((name, concurrency), Tally())


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system


async def timed(
    run: Callable[[], Awaitable[None]], requests: int, sandbox: tuple[int, ...], tally: Tally
) -> None:
    """Run one block, adding its wall time and CPU to the tally."""
    server = sum(map(process_cpu, sandbox))
    cpu, start = _own_cpu(), time.perf_counter()
    await run()
    tally.seconds += time.perf_counter() - start
    tally.cpu += _own_cpu() - cpu
    tally.sandbox += sum(map(process_cpu, sandbox)) - server
    tally.requests += requests


async def measure(targets: Targets, sandbox: tuple[int, ...], block: int, rounds: int) -> Results:
    """Every client at every concurrency: a warm-up block, then `rounds` alternating blocks
    of about `block` requests each."""
    results = Results()
    live = [kind(targets) for kind in clients()]
    try:
        for concurrency in CONCURRENCY:
            per_worker = max(1, block // (2 * concurrency))
            requests = 2 * per_worker * concurrency
            for client in live:  # connections open, caches warm
                await pairs(client, concurrency, max(1, per_worker // 4))
            for r in range(rounds):
                for client in live if r % 2 == 0 else live[::-1]:
                    tally = results.of(client.name, concurrency)
                    block_of = functools.partial(pairs, client, concurrency, per_worker)
                    await timed(block_of, requests, sandbox, tally)
    finally:
        for client in live:
            await client.close()
    return results


def _against_httpx(results: Results, name: str) -> str:
    return ", ".join(
        f"{ratio(results.of(name, c).cpu_us(), results.of(HTTPX, c).cpu_us()):.2f}x at {c}"
        for c in CONCURRENCY
    )


def recommendation(results: Results) -> str:
    """The one line that follows from the figures."""
    aio = [
        ratio(results.of(AIOHTTP, c).cpu_us(), results.of(HTTPX, c).cpu_us()) for c in CONCURRENCY
    ]
    ours, bare, floor = (_against_httpx(results, n) for n in (EXECUTOR, AIOHTTP, RAW))
    if all(v <= MARKEDLY for v in aio):
        return (
            f"the executor uses aiohttp, and should: bare aiohttp is {bare} httpx's CPU per "
            f"request (markedly cheaper means <= {MARKEDLY:g}x at both), the executor's "
            f"client as built {ours}; the raw floor is {floor}"
        )
    return (
        f"aiohttp measured {bare} httpx's CPU per request here, not markedly cheaper "
        f"(<= {MARKEDLY:g}x at both): look again at the switch; the executor's client as "
        f"built {ours}, the raw floor {floor}"
    )


def candidate(results: Results) -> str | None:
    """What the figures say of the candidate against the executor's client as built."""
    if (REQWEST, CONCURRENCY[0]) not in results.tallies:
        return None
    against = [
        ratio(results.of(REQWEST, c).cpu_us(), results.of(EXECUTOR, c).cpu_us())
        for c in CONCURRENCY
    ]
    each = ", ".join(f"{v:.2f}x at {c}" for v, c in zip(against, CONCURRENCY, strict=True))
    verdict = (
        "markedly cheaper: worth the switch (the send horizon's last-moment check, the "
        "error classes and streaming move with it)"
        if all(v <= MARKEDLY for v in against)
        else f"not markedly cheaper (<= {MARKEDLY:g}x at both)"
    )
    return f"pyreqwest is {each} the executor's client's CPU per request: {verdict}"


def _print(results: Results) -> None:
    rows = []
    for concurrency in CONCURRENCY:
        base = results.of(HTTPX, concurrency)
        for kind in clients():
            t = results.of(kind.name, concurrency)
            rows.append(
                [
                    f"{kind.name}, concurrency {concurrency}",
                    f"{t.requests:,}",
                    f"{t.seconds:.2f}",
                    f"{t.per_second:,.0f}",
                    f"{t.cpu_us():.0f}",
                    f"{ratio(t.cpu_us(), base.cpu_us()):.2f}x",
                    f"{t.cpu_us('sandbox'):.0f}",
                ]
            )
    headers = (
        "",
        "requests",
        "seconds",
        "requests/s",
        "client CPU us/req",
        "vs httpx",
        "sandbox CPU us/req",
    )
    report.table(headers, rows)
    report.note("half model calls (chat completion, ~1 KB JSON each way), half echo tool calls;")
    report.note("client CPU: this process (the client and its event loop), all threads")
    report.note("why they differ: aiohttp parses HTTP in C (llhttp) and sends a request in one")
    report.note("write; httpx goes through httpcore, h11 (pure Python) and anyio, two writes;")
    report.note("the executor's client is aiohttp plus its request class (the send horizon's")
    report.note("check), error classes and the answer read whole; pyreqwest parses and does its")
    report.note("I/O in Rust (hyper on a tokio thread), one hand-off each way per request")
    report.note(f"recommendation: {recommendation(results)}")
    if (line := candidate(results)) is not None:
        report.note(f"candidate: {line}")


async def main(quick: bool) -> None:
    block, rounds = (300, 2) if quick else (1000, 3)
    with workdir("http_client") as tmp, Procs(tmp) as procs:
        model, model_port = await start_sandbox(procs, "model")
        providers, providers_port = await start_sandbox(procs, "providers")
        targets = Targets(
            f"http://127.0.0.1:{model_port}/v1/chat/completions",
            f"http://127.0.0.1:{providers_port}/echo",
        )
        results = await measure(targets, (model.pid, providers.pid), block, rounds)
    _print(results)


def run(quick: bool = False) -> None:
    report.heading("http_client: the executor's HTTP calls, CPU per request by client")
    if not module_available("sandbox.__main__"):
        report.note("http_client skipped: `python -m sandbox` is missing")
        return
    report.note(
        f"event loop: {event_loop.chosen()} (the executor's); "
        f"{os.cpu_count()} cores shared with other tenants"
    )
    event_loop.run(main(quick))
