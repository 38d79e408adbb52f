"""DBOS's async configuration: the same runs as bench/dbos_baseline.py, with aiohttp.

The executor's HTTP client is aiohttp (executor/models/provider_http.py), so DBOS is given the
same client too, the only way it can use it: async workflows and async steps on one event
loop (uvloop, as the executors run), `concurrency` workflows in flight. DBOS records an async
step's output from a worker thread (asyncio.to_thread in dbos/_core.py), which is its design,
not ours to change. The same conversation, requests and headers as the sync configuration
(`dbos_baseline.conversation`); bench/e2e.py sweeps both and compares with the best.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from dbos import DBOS

from bench.dbos_baseline import ENDPOINTS, MODEL, TOOLS, DbosResult, _urls, launched, play_async
from telemetry.event_loop import chosen

_SESSION: list[aiohttp.ClientSession] = []


def _session() -> aiohttp.ClientSession:
    assert _SESSION, "measure_async() opens the session"
    return _SESSION[0]


async def post_model(run_id: str, seq: int, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"model": MODEL, "messages": messages, "tools": TOOLS}
    headers = {"X-Agentrun-Run-Id": run_id, "X-Agentrun-Seq": str(seq)}
    async with _session().post(ENDPOINTS.model_url, json=body, headers=headers) as response:
        response.raise_for_status()
        data = await response.json()
    next(ENDPOINTS.actions)
    message: dict[str, Any] = data["choices"][0]["message"]
    return message


async def post_echo(key: str, arguments: str) -> Any:
    headers = {"Idempotency-Key": key, "Accept": "application/json"}
    body = json.loads(arguments)
    async with _session().post(ENDPOINTS.echo_url, json=body, headers=headers) as response:
        response.raise_for_status()
        result = await response.json()
    next(ENDPOINTS.actions)
    return result


@DBOS.step()
async def model_call_async(run_id: str, seq: int, messages: list[dict[str, Any]]) -> dict[str, Any]:
    return await post_model(run_id, seq, messages)


@DBOS.step()
async def echo_call_async(key: str, arguments: str) -> Any:
    return await post_echo(key, arguments)


@DBOS.workflow()
async def agent_run_async(text: str) -> str:
    """One run as an async DBOS workflow: each model and tool call a step DBOS records."""
    return await play_async(str(DBOS.workflow_id), text, model_call_async, echo_call_async)


async def http_only_run(text: str) -> str:
    """The same run's HTTP calls with no DBOS around them: DBOS's HTTP client share."""
    return await play_async(str(uuid.uuid4()), text, post_model, post_echo)


async def _timed(
    run: Callable[[str], Awaitable[str]],
    workflows: int,
    concurrency: int,
    on_start: Callable[[], object],
    on_end: Callable[[], object],
) -> tuple[list[str], int, float]:
    connector = aiohttp.TCPConnector(limit=concurrency * 2, keepalive_timeout=2.0)
    timeout = aiohttp.ClientTimeout(total=60.0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        _SESSION.append(session)
        try:
            gate = asyncio.Semaphore(concurrency)

            async def one(text: str) -> str:
                async with gate:
                    return await run(text)

            await asyncio.gather(*(one(f"warm-up {i}") for i in range(concurrency)))
            texts = [f"benchmark run {i} {uuid.uuid4().hex[:6]}" for i in range(workflows)]
            ENDPOINTS.actions = itertools.count()
            on_start()  # blocks this loop for a moment: only the marks, before the clock starts
            start = time.perf_counter()
            answers = await asyncio.gather(*(one(t) for t in texts))
            elapsed = time.perf_counter() - start
            on_end()
            return answers, next(ENDPOINTS.actions), elapsed
        finally:
            _SESSION.clear()


def _run_timed(
    run: Callable[[str], Awaitable[str]],
    workflows: int,
    concurrency: int,
    on_start: Callable[[], object],
    on_end: Callable[[], object],
) -> tuple[int, float]:
    """The timed runs on their own event loop of the executors' kind; (actions, seconds)."""
    factory = None
    if chosen() == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        answers, actions, elapsed = runner.run(
            _timed(run, workflows, concurrency, on_start, on_end)
        )
    if len(answers) != workflows or not all(answers):
        raise RuntimeError(f"{sum(map(bool, answers))} of {workflows} runs answered")
    return actions, elapsed


def measure_async(
    dsn: str,
    model_base: str,
    providers_base: str,
    workflows: int,
    concurrency: int,
    on_start: Callable[[], object] = lambda: None,
    on_end: Callable[[], object] = lambda: None,
) -> DbosResult:
    """Launch DBOS on `dsn`, run `workflows` async runs `concurrency` at a time, time them.

    Blocking: call it in a worker thread (it runs its own event loop there).
    """
    _urls(model_base, providers_base)
    return launched(
        dsn,
        workflows,
        concurrency,
        lambda: _run_timed(agent_run_async, workflows, concurrency, on_start, on_end),
    )


def measure_http_only(
    model_base: str,
    providers_base: str,
    workflows: int,
    concurrency: int,
    on_start: Callable[[], object] = lambda: None,
    on_end: Callable[[], object] = lambda: None,
) -> DbosResult:
    """The same runs, concurrency and aiohttp session as `measure_async`, without DBOS."""
    _urls(model_base, providers_base)
    return launched(
        None,
        workflows,
        concurrency,
        lambda: _run_timed(http_only_run, workflows, concurrency, on_start, on_end),
    )
