"""What authentication costs: StartRun and the per-step commit, with and without it.

Two control planes on one database, served by one process (bench/auth_server.py), so that
the identity interceptor is all that differs between them:

* authenticated: the shipped server. Every StartRun carries an admin key the identity
  interceptor parses, looks up (a cached row, AGENTRUN_KEY_CACHE_SECONDS) and compares
  (SHA-256, constant time) before checking the role; the executor stream presents its
  executor credential once, when Connect opens, and no commit pays for it again.
* unauthenticated baseline: the same servicers and error interceptor, with the identity
  interceptor replaced by one that serves every call as a fixed principal and reads no
  credential. Built for this measurement only; never a mode of the product.

This process is the client of both: sequential StartRun calls, then one model_decision
commit at a time over a held lease, in alternating blocks so that noise from other tenants
of the machine falls on both sides alike (turns of 20 calls, the order flipped each round). Targets: StartRun p50 authenticated <= 1.1x the
baseline; the commit round trip unchanged (<= 1.1x).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc

from agentrun.v1 import run_pb2, run_pb2_grpc
from bench import api, report
from bench.auth_server import BASELINE_SUFFIX
from bench.commit import StreamExecutor, alternate
from bench.postgres import bench_postgres, durability
from bench.procs import Procs, workdir
from bench.services import REPO, _env, _python
from bench.stats import Summary, ratio

TARGET = 1.1
BLOCK = 20  # short turns: a burst of load from another tenant lands on both sides
START_AUTH = "StartRun, authenticated (bearer key checked)"
START_BASE = "StartRun, unauthenticated baseline"
COMMIT_AUTH = "Commit, authenticated stream (key at Connect)"
COMMIT_BASE = "Commit, unauthenticated baseline stream"


async def start_servers(procs: Procs, dsn: str) -> tuple[int, int]:
    """`python -m bench.auth_server` on free ports; the authenticated and baseline ports."""
    name = "control_plane_auth"
    port_file = procs.workdir / f"{name}.port"
    env = _env(
        DATABASE_URL=dsn,
        AGENTRUN_LISTEN="127.0.0.1:0",
        AGENTRUN_HTTP_LISTEN="127.0.0.1:0",
        AGENTRUN_LOG_LEVEL="WARNING",
        AGENTRUN_PORT_FILE=str(port_file),
    )
    proc = procs.start(name, _python("bench.auth_server"), env, cwd=REPO)
    # The baseline's port file is written before the one this waits for.
    auth_port = await proc.wait_port(within=60)
    baseline_file = Path(f"{port_file}{BASELINE_SUFFIX}")
    base_port = int(baseline_file.read_text().strip())  # noqa: ASYNC240 - a few bytes, once
    return auth_port, base_port


def start_run_probe(chan: grpc.aio.Channel, key: str | None) -> Callable[[], Awaitable[float]]:
    """Sequential StartRun calls; the key (if any) in each call's metadata, as a client sends
    it, on a channel with no client interceptors on either side."""
    stub = run_pb2_grpc.RunServiceStub(chan)
    request = run_pb2.StartRunRequest(workspace_id=api.WORKSPACE, agent_id="auth", input="hi")
    metadata = (("authorization", f"Bearer {key}"),) if key else None

    async def once() -> float:
        start = time.perf_counter()
        await stub.StartRun(request, metadata=metadata)
        return time.perf_counter() - start

    return once


async def _measure(dsn: str, procs: Procs, n: int) -> dict[str, Summary]:
    keys = await api.mint_keys(dsn)
    auth_port, base_port = await start_servers(procs, dsn)
    async with (
        api.channel(auth_port, keys.admin) as setup,
        api.channel(auth_port, None) as auth,
        api.channel(base_port, None) as base,
    ):
        await api.publish_agent(setup, "auth", model="steps10", tools=[])
        # One run for each executor stream to hold; each stream asks for one run only,
        # so the StartRun series' runs stay queued.
        ours = StreamExecutor(auth, "bench-auth", key=keys.executor)
        theirs = StreamExecutor(base, "bench-base")
        try:
            await api.start_run(setup, "auth", "held by the authenticated stream")
            await ours.take_run()
            await api.start_run(setup, "auth", "held by the baseline stream")
            await theirs.take_run()
            commits = await alternate(
                {COMMIT_AUTH: ours.commit_one, COMMIT_BASE: theirs.commit_one}, n, BLOCK
            )
        finally:
            ours.close()
            theirs.close()
        starts = await alternate(
            {
                START_AUTH: start_run_probe(auth, keys.admin),
                START_BASE: start_run_probe(base, None),
            },
            n,
            BLOCK,
        )
    return {**starts, **commits}


def _print(results: dict[str, Summary]) -> None:
    report.table(report.LATENCY_HEADERS, [report.latency_row(k, v) for k, v in results.items()])
    for what, ours, theirs in (
        ("StartRun", START_AUTH, START_BASE),
        ("commit", COMMIT_AUTH, COMMIT_BASE),
    ):
        r = ratio(results[ours].p50, results[theirs].p50)
        report.target(f"{what} p50 auth/baseline", r, f"<= {TARGET:g}x", r <= TARGET)
        p99 = ratio(results[ours].p99, results[theirs].p99)
        report.note(f"{what} p99 auth/baseline {p99:.2f}x (informational)")


async def main(quick: bool = False) -> None:
    n = 300 if quick else 1000  # p50 targets: 1,000 samples a series pin them down
    report.heading(f"auth: what authentication costs, {n} sequential calls a series")
    report.note("authenticated: the shipped server; every StartRun sends an admin key, the")
    report.note("  executor stream its executor credential once, at Connect")
    report.note("baseline: same servicers, no identity interceptor (a fixed principal, no key")
    report.note("  read); for this measurement only, never a shipped mode")
    with workdir("auth") as tmp:
        async with bench_postgres() as pg:
            dsn = await pg.create_database("auth")
            report.note(await durability(dsn))
            with Procs(tmp) as procs:
                results = await _measure(dsn, procs, n)
    _print(results)


def run(quick: bool = False) -> None:
    asyncio.run(main(quick))
