"""What bounds e2e's CPU-per-action target: each side's HTTP client share, measured apart.

A DBOS step and an agentrun action both spend CPU in their HTTP client before anything
durable happens. Here the same `steps10` runs' requests (5 model calls, 4 echo calls, the
conversation growing as the executor's does) go to the same sandbox servers with nothing
around them (no DBOS, no control plane, no Postgres, no Redis):

  * DBOS's way, in the mode of its best configuration: its sync httpx Client on that many
    threads (bench/dbos_baseline.py `measure_http_only`), or aiohttp on one event loop with
    that many runs at a time (bench/dbos_async.py `measure_http_only`).
  * the executor's way: its own client classes, aiohttp underneath (bench/http_client.py
    ExecutorClient), CAPACITY runs at a time on one event loop of the executor's kind
    (telemetry/event_loop.py), in a thread of this process.
  * httpx AsyncClients with the executor's former settings (bench/http_client.py
    HttpxClient): what the share was before the switch, and what DBOS's client costs the
    executor's way.

CPU is this process's (all threads) over the timed runs; the benchmark's own loop idles.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

from bench import http_client, report
from bench.cpu import CpuMeter
from bench.services import module_available
from bench.stats import ratio
from telemetry import event_loop

DBOS_SYNC = "httpx Client, DBOS's threads"
DBOS_ASYNC = "aiohttp, DBOS's async workflows"
EXECUTOR = "the executor's client, aiohttp"
EXECUTOR_HTTPX = "httpx AsyncClient, the executor's former settings"
TRIES = 2  # a share's tries before it is left out


@dataclass(frozen=True)
class Share:
    label: str
    actions: int
    seconds: float
    cpu: float  # CPU seconds of this process over the timed runs

    @property
    def per_action(self) -> float:
        return ratio(self.cpu, self.actions)


async def play(client: http_client.Client, text: str) -> int:
    """One steps10 run's calls, as the executor makes them; the actions it took."""
    run_id, seq, actions = str(uuid.uuid4()), 1, 0
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "benchmark"},
        {"role": "user", "content": text},
    ]
    while True:
        body = {"model": http_client.MODEL, "messages": messages, "tools": http_client.TOOLS}
        message = (await client.model(body, run_id, seq))["choices"][0]["message"]
        seq, actions = seq + 1, actions + 1
        calls = message.get("tool_calls") or []
        if not calls:
            return actions
        messages.append(
            {"role": "assistant", "content": message.get("content"), "tool_calls": calls}
        )
        for call in calls:
            arguments = json.loads(call["function"]["arguments"])
            result = await client.echo(arguments, f"{run_id}:{call['id']}")
            actions += 1
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)}
            )


async def _concurrent(client: http_client.Client, texts: list[str], concurrency: int) -> int:
    pending: Iterator[str] = iter(texts)
    done = [0]

    async def worker() -> None:
        for text in pending:  # one shared iterator: each run is taken once
            actions = await play(client, text)  # (not `+= await`: it would read before)
            done[0] += actions

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done[0]


async def _executor_way(
    make: Callable[[http_client.Targets], http_client.Client],
    targets: http_client.Targets,
    runs: int,
    concurrency: int,
    label: str,
) -> Share:
    client = make(targets)
    try:
        await _concurrent(client, [f"warm-up {i}" for i in range(concurrency)], concurrency)
        texts = [f"benchmark run {i} {uuid.uuid4().hex[:6]}" for i in range(runs)]
        before, start = os.times(), time.perf_counter()
        actions = await _concurrent(client, texts, concurrency)
        seconds, after = time.perf_counter() - start, os.times()
    finally:
        await client.close()
    cpu = after.user + after.system - before.user - before.system
    return Share(label, actions, seconds, cpu)


def _executor_once(
    make: Callable[[http_client.Targets], http_client.Client],
    targets: http_client.Targets,
    runs: int,
    concurrency: int,
    label: str,
) -> Share:
    """The executor's way on an event loop of its own (a fresh one each try)."""
    return event_loop.run(_executor_way(make, targets, runs, concurrency, label))


def _dbos_way(model_base: str, providers_base: str, runs: int, mode: str, threads: int) -> Share:
    """DBOS's HTTP calls alone, in the mode of its best configuration (bench/e2e.py)."""
    from bench import dbos_async, dbos_baseline  # optional dependencies

    meters: list[CpuMeter] = []
    alone = dbos_async.measure_http_only if mode == "async" else dbos_baseline.measure_http_only
    result = alone(
        model_base,
        providers_base,
        runs,
        threads,
        on_start=lambda: meters.append(CpuMeter({"own": [os.getpid()]}, "other")),
        on_end=lambda: meters[0].stop(),
    )
    cpu = meters[0].used()["own"]
    return Share(_dbos_label(mode, threads), result.actions, result.seconds, cpu)


def _dbos_label(mode: str, threads: int) -> str:
    return f"{DBOS_ASYNC if mode == 'async' else DBOS_SYNC} ({threads})"


async def measure(
    model_base: str,
    providers_base: str,
    runs: int,
    dbos: tuple[str, int] | None,
    concurrency: int,
) -> list[Share]:
    """The shares, each in its own timed window (threads and loops of their own)."""
    targets = http_client.Targets(
        model_base.rstrip("/") + "/chat/completions", providers_base.rstrip("/") + "/echo"
    )
    tries: list[tuple[str, Callable[[], Share]]] = []
    if dbos is not None and module_available("dbos"):
        mode, threads = dbos
        dbos_once = partial(_dbos_way, model_base, providers_base, runs, mode, threads)
        tries.append((_dbos_label(mode, threads), dbos_once))
    ways: list[tuple[str, Callable[[http_client.Targets], http_client.Client]]] = [
        (EXECUTOR, http_client.ExecutorClient),
        (EXECUTOR_HTTPX, http_client.HttpxClient),
    ]
    for label, make in ways:
        tries.append((label, partial(_executor_once, make, targets, runs, concurrency, label)))
    shares = []
    for label, once in tries:
        if (share := await _tried(label, once)) is not None:
            shares.append(share)
    return shares


async def _tried(label: str, once: Callable[[], Share]) -> Share | None:
    """`once` in a thread of its own, tried again once if it fails (a connection the
    sandbox reset under a burst of a thousand calls on two cores); each failure is said,
    and a share that failed twice is left out of the arithmetic rather than e2e's result
    with it."""
    for attempt in range(1, TRIES + 1):
        try:
            return await asyncio.to_thread(once)
        except Exception as exc:  # noqa: BLE001 - said in the output, then tried again
            report.note(
                f"HTTP calls alone, {label}: try {attempt} of {TRIES} failed: "
                f"{type(exc).__name__}: {exc}"
            )
    return None


def _ms(seconds: float) -> str:
    return "n/a" if math.isnan(seconds) else f"{seconds * 1000:.2f}"


def explain(dbos_total: float, ours_total: float, shares: list[Share], target: float) -> None:
    """Print the arithmetic: DBOS = its HTTP share + the rest; what that leaves agentrun."""
    by = {s.label.split(" (")[0]: s for s in shares}
    report.table(
        ("HTTP calls alone (no durability)", "actions", "seconds", "CPU ms/action"),
        [[s.label, str(s.actions), f"{s.seconds:.2f}", _ms(s.per_action)] for s in shares],
    )
    sync, ours = by.get(DBOS_SYNC) or by.get(DBOS_ASYNC), by.get(EXECUTOR)
    if sync is None or ours is None:
        return
    rest = dbos_total - sync.per_action
    budget = target * dbos_total
    ours_rest = ours_total - ours.per_action
    report.note(
        f"CPU ms/action: DBOS {_ms(dbos_total)} = its HTTP calls ({sync.label}) "
        f"{_ms(sync.per_action)}"
        f" + DBOS's own work {_ms(rest)}; <= {target:g}x leaves agentrun's control "
        f"plane + executors {_ms(budget)} in all"
    )
    report.note(
        f"agentrun {_ms(ours_total)} = the executors' HTTP calls (aiohttp) "
        f"{_ms(ours.per_action)}"
        f" + everything else {_ms(ours_rest)}: the client alone is "
        f"{ratio(ours.per_action, budget):.1f}x that budget"
    )
    report.note(
        f"both sides on one client costing H a call: agentrun / DBOS >= H / (H + "
        f"{_ms(rest)}) with all else of ours free; <= {target:g}x needs H <= "
        f"{_ms(rest * target / (1 - target))} and our rest <= {target:g} x {_ms(rest)} - "
        f"{1 - target:g} H:"
    )
    for share in (s for s in shares if s is not sync):
        h = share.per_action
        room = target * rest - (1 - target) * h
        verdict = f"our rest must fit in {_ms(room)}" if room > 0 else "out of reach"
        report.note(
            f"  {share.label}: H = {_ms(h)}, best ratio {ratio(h, h + rest):.2f}x; "
            f"{verdict} (today's rest: {_ms(ours_rest)})"
        )
