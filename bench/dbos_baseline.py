"""DBOS Transact baseline doing the agentrun run's work: the same HTTP calls, each a DBOS step.

DBOS is a library, so its workflows run in this process against their own database on the
same Postgres server as agentrun's. One workflow is one `steps10` run done by hand: a model
call (POST /v1/chat/completions to the same sandbox model server, with the same echo tool
schema and the same conversation the executor sends), then each tool call it asks for (POST
/echo to the same sandbox providers server, with an Idempotency-Key), until the model
answers: 5 model calls and 4 tool calls, 9 actions, each a `@DBOS.step` whose output DBOS
records in Postgres before the workflow goes on. The client is httpx, as in the executor
(its sync Client here: DBOS's sync workflows ran faster than its async ones on this kind of
machine), one shared pool. What DBOS does not do that agentrun does: no token bucket in
Redis before each tool call, no lease, no fairness or caps, no separate control plane.

Concurrency: `threads` worker threads, each calling the workflow function directly (DBOS
runs it inline in the caller's thread) for one workflow after another, so the sweep in
bench/e2e.py sets exactly how many workflows are in flight.

HTTP share (`measure_http_only`): the same runs on the same threads with the same httpx
Client, the same model and tool requests in the same order, with no DBOS around them (no
workflow, no step record): what DBOS's CPU per action is before DBOS does anything.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
from dbos import DBOS

from executor.tools.catalogue import Catalogue

MODEL = "steps10"
INSTRUCTIONS = "benchmark"
TOOLS = Catalogue.load().openai_tools(["echo"])


@dataclass
class Endpoints:
    model_url: str  # .../v1/chat/completions
    echo_url: str  # .../echo
    client: httpx.Client | None = None
    actions: itertools.count[int] = field(default_factory=itertools.count)

    def http(self) -> httpx.Client:
        assert self.client is not None, "measure() opens the client"
        return self.client


ENDPOINTS = Endpoints("", "")


def post_model(run_id: str, seq: int, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The model call's HTTP request (the DBOS step below and the HTTP-only loop share it)."""
    body = {"model": MODEL, "messages": messages, "tools": TOOLS}
    headers = {"X-Agentrun-Run-Id": run_id, "X-Agentrun-Seq": str(seq)}
    response = ENDPOINTS.http().post(ENDPOINTS.model_url, json=body, headers=headers)
    response.raise_for_status()
    next(ENDPOINTS.actions)  # atomic under the GIL
    message: dict[str, Any] = response.json()["choices"][0]["message"]
    return message


def post_echo(key: str, arguments: str) -> Any:
    """The echo tool call's HTTP request."""
    headers = {"Idempotency-Key": key, "Accept": "application/json"}
    response = ENDPOINTS.http().post(
        ENDPOINTS.echo_url, json=json.loads(arguments), headers=headers
    )
    response.raise_for_status()
    next(ENDPOINTS.actions)
    return response.json()


ModelCall = Callable[[str, int, list[dict[str, Any]]], dict[str, Any]]
EchoCall = Callable[[str, str], Any]
# What the conversation asks for next: ("model", seq, messages) or ("echo", key, arguments).
Request = tuple[str, Any, Any]


def conversation(run_id: str, text: str) -> Generator[Request, Any, str]:
    """Model, then its tool calls, until it answers: yields each request, is sent its answer,
    returns the answer. The sync and async drivers below share it."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": text},
    ]
    seq = itertools.count(1)
    while True:
        message = yield ("model", next(seq), messages)
        calls = message.get("tool_calls") or []
        if not calls:
            return str(message.get("content") or "")
        messages.append(
            {"role": "assistant", "content": message.get("content"), "tool_calls": calls}
        )
        for call in calls:
            result = yield ("echo", f"{run_id}:{call['id']}", call["function"]["arguments"])
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)}
            )


def play(run_id: str, text: str, model: ModelCall, echo: EchoCall) -> str:
    """One run's conversation with blocking calls."""
    talk = conversation(run_id, text)
    answer: Any = None
    try:
        while True:
            kind, first, second = talk.send(answer)
            answer = model(run_id, first, second) if kind == "model" else echo(first, second)
    except StopIteration as done:
        return str(done.value)


async def play_async(
    run_id: str,
    text: str,
    model: Callable[..., Awaitable[Any]],
    echo: Callable[..., Awaitable[Any]],
) -> str:
    """One run's conversation with awaited calls."""
    talk = conversation(run_id, text)
    answer: Any = None
    try:
        while True:
            kind, first, second = talk.send(answer)
            answer = await (
                model(run_id, first, second) if kind == "model" else echo(first, second)
            )
    except StopIteration as done:
        return str(done.value)


@DBOS.step()
def model_call(run_id: str, seq: int, messages: list[dict[str, Any]]) -> dict[str, Any]:
    return post_model(run_id, seq, messages)


@DBOS.step()
def echo_call(key: str, arguments: str) -> Any:
    return post_echo(key, arguments)


@DBOS.workflow()
def agent_run(text: str) -> str:
    """One run as a DBOS workflow: each model and tool call a step DBOS records."""
    return play(str(DBOS.workflow_id), text, model_call, echo_call)


def http_only_run(text: str) -> str:
    """The same run's HTTP calls with no DBOS around them: DBOS's HTTP client share."""
    return play(str(uuid.uuid4()), text, post_model, post_echo)


@dataclass(frozen=True)
class DbosResult:
    workflows: int
    threads: int
    actions: int  # model calls + tool calls of the timed workflows
    seconds: float


def _config(dsn: str, threads: int) -> dict[str, Any]:
    return {
        "name": "agentrun-bench",
        "system_database_url": dsn,
        "log_level": "WARNING",
        # Room for every worker thread's step writes, so the pool is not what limits it.
        "sys_db_pool_size": threads + 4,
    }


def _timed(
    run: Callable[[str], str],
    workflows: int,
    threads: int,
    on_start: Callable[[], object],
    on_end: Callable[[], object],
) -> tuple[int, float]:
    """Warm up, then `workflows` runs on `threads` threads, timed; (actions, seconds)."""
    limits = httpx.Limits(max_connections=threads * 2, keepalive_expiry=2.0)
    with httpx.Client(limits=limits, timeout=60.0) as client, ThreadPoolExecutor(threads) as pool:
        ENDPOINTS.client = client
        # Every thread's connection (and DBOS's caches) warm, not timed.
        list(pool.map(run, [f"warm-up {i}" for i in range(threads)]))
        texts = [f"benchmark run {i} {uuid.uuid4().hex[:6]}" for i in range(workflows)]
        ENDPOINTS.actions = itertools.count()
        on_start()
        start = time.perf_counter()
        answers = list(pool.map(run, texts))
        elapsed = time.perf_counter() - start
        on_end()
        actions = next(ENDPOINTS.actions)
        ENDPOINTS.client = None
    if len(answers) != workflows or not all(answers):
        raise RuntimeError(f"{sum(map(bool, answers))} of {workflows} runs answered")
    return actions, elapsed


def _urls(model_base: str, providers_base: str) -> None:
    ENDPOINTS.model_url = model_base.rstrip("/") + "/chat/completions"
    ENDPOINTS.echo_url = providers_base.rstrip("/") + "/echo"


def launched(
    dsn: str | None, workflows: int, workers: int, timed: Callable[[], tuple[int, float]]
) -> DbosResult:
    """`timed()` -> (actions, seconds), inside DBOS launched on `dsn` (None: no DBOS at all)."""
    if dsn is None:
        actions, elapsed = timed()
        return DbosResult(workflows, workers, actions, elapsed)
    DBOS(config=_config(dsn, workers))  # type: ignore[arg-type]
    try:
        DBOS.launch()
        actions, elapsed = timed()
    finally:
        DBOS.destroy()
    return DbosResult(workflows, workers, actions, elapsed)


def measure(
    dsn: str,
    model_base: str,
    providers_base: str,
    workflows: int,
    threads: int,
    on_start: Callable[[], object] = lambda: None,
    on_end: Callable[[], object] = lambda: None,
) -> DbosResult:
    """Launch DBOS on `dsn`, run `workflows` runs on `threads` threads, time them, shut down.

    Blocking (DBOS's sync API): call it in a worker thread. `on_start` and `on_end` are
    called right before and after the timed runs (launch and warm-up are not measured).
    """
    _urls(model_base, providers_base)
    return launched(
        dsn, workflows, threads, lambda: _timed(agent_run, workflows, threads, on_start, on_end)
    )


def measure_http_only(
    model_base: str,
    providers_base: str,
    workflows: int,
    threads: int,
    on_start: Callable[[], object] = lambda: None,
    on_end: Callable[[], object] = lambda: None,
) -> DbosResult:
    """The same runs, threads and httpx client as `measure`, without DBOS: the HTTP share."""
    _urls(model_base, providers_base)
    return launched(
        None,
        workflows,
        threads,
        lambda: _timed(http_only_run, workflows, threads, on_start, on_end),
    )
