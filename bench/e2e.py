"""End to end: sandbox `steps10` runs through real processes, against DBOS recording steps.

Real processes: the sandbox model and providers servers, the control plane, Redis, and 1,
then 4, executors (capacity 32 each). Policies are in place but set not to bind, so that the
fleet is the limit: the workspace's plan caps it at every executor slot, and each echo call
takes a token from a Redis bucket too large to run dry. Each phase waits until its executors
are connected, warms them up with a few runs, then starts the measured runs concurrently
through RunService.StartRun and polls Postgres until all are completed. Its time is the
database's own span from the first admission to the last finish; steps are the step rows
the runs wrote (input, decisions, tool_started, tool_result, finish). Runs whose log is not
the usual one (a park, a retry, a takeover) and warnings the processes logged are printed.
Then DBOS runs as many ten-step workflows against its own database on the same server
(bench/dbos_baseline.py).
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections import Counter
from dataclasses import dataclass

import asyncpg
import grpc

from bench import api, report
from bench.cpu import CpuMeter
from bench.postgres import BenchPostgres, bench_postgres, durability
from bench.procs import Proc, Procs, workdir
from bench.redis_server import redis_url
from bench.services import (
    ExecutorLinks,
    module_available,
    start_control_plane,
    start_executor,
    start_sandbox,
)
from bench.stats import ratio
from control_plane.store import workspaces
from control_plane.store.db import create_pool

EXECUTOR_COUNTS = (1, 4)
CAPACITY = 32
# The bench workspace's cap: every executor slot, so the fleet is the limit, not the plan.
WORKSPACE_CAP = CAPACITY * max(EXECUTOR_COUNTS)
# Every echo call still takes its token from Redis, but the bucket never runs dry: the
# benchmark measures the system, not the default 50 calls/s of one provider connection.
ECHO_UNLIMITED = "echo=1000000/s,echo.global=1000000/s"
WARMUP_PER_EXECUTOR = 8
START_IN_FLIGHT = 100
POLL_SECONDS = 0.1
TARGET = 5.0

STATUS_COUNTS = "SELECT status, count(*) AS n FROM runs WHERE agent_id = $1 GROUP BY status"
SPAN = """
SELECT extract(epoch FROM max(finished_at) - min(created_at)) AS seconds,
       (SELECT count(*) FROM steps s JOIN runs r2 USING (workspace_id, run_id)
        WHERE r2.agent_id = $1) AS steps
FROM runs WHERE agent_id = $1
"""
# Every run's log as "kind@epoch" items (a park with its reason and note), for spotting runs
# that did not go the usual way.
LOG_SHAPES = """
SELECT r.run_id, r.attempt, r.lease_epoch,
       string_agg(s.kind || coalesce('(' || (s.payload ->> 'wait_reason') || ': '
                                     || coalesce(s.payload ->> 'note', '') || ')', '')
                  || '@' || s.epoch, ' ' ORDER BY s.seq) AS shape
FROM runs r JOIN steps s USING (workspace_id, run_id)
WHERE r.agent_id = $1
GROUP BY r.run_id, r.attempt, r.lease_epoch
"""
FAILURES = """
SELECT status, error, step_count FROM runs
WHERE agent_id = $1 AND status IN ('failed', 'cancelled') LIMIT 3
"""


@dataclass(frozen=True)
class Throughput:
    label: str
    runs: int
    steps: int
    seconds: float

    def row(self) -> list[str]:
        return [self.label, str(self.runs), str(self.steps), f"{self.seconds:.2f}",
                f"{self.runs_per_second:,.1f}", f"{self.steps_per_second:,.0f}"]  # fmt: skip

    @property
    def runs_per_second(self) -> float:
        return ratio(self.runs, self.seconds)

    @property
    def steps_per_second(self) -> float:
        return ratio(self.steps, self.seconds)


@dataclass
class Stack:
    """The long-lived processes of the agentrun half and how to reach them."""

    procs: Procs
    control_plane: Proc
    links: ExecutorLinks
    sandbox_pids: tuple[int, ...]
    conn: asyncpg.Connection

    def cpu_meter(self, fleet: list[Proc]) -> CpuMeter:
        groups = {
            "control plane": [self.control_plane.pid],
            "executors": [p.pid for p in fleet],
            "sandbox servers": list(self.sandbox_pids),
        }
        return CpuMeter(groups, rest="Postgres, this process and other tenants")

    def executors(self, n: int) -> list[Proc]:
        return [
            start_executor(self.procs, f"bench-e2e-{n}x-{i}", self.links, CAPACITY)
            for i in range(n)
        ]


async def set_workspace_cap(dsn: str) -> None:
    pool = await create_pool(dsn, min_size=1, max_size=1)
    try:
        await workspaces.set_plan(pool, api.WORKSPACE, "enterprise", WORKSPACE_CAP)
    finally:
        await pool.close()


async def wait_done(
    stack: Stack, agent_id: str, runs: int, deadline: float, fleet: list[Proc]
) -> None:
    """Poll until the agent's runs all completed; fail on a bad end, a death or the deadline."""
    end = time.monotonic() + deadline
    while True:
        counts = {r["status"]: r["n"] for r in await stack.conn.fetch(STATUS_COUNTS, agent_id)}
        if counts.get("completed", 0) == runs:
            return
        if counts.get("failed") or counts.get("cancelled"):
            sample = [dict(r) for r in await stack.conn.fetch(FAILURES, agent_id)]
            raise RuntimeError(f"{agent_id}: runs ended badly: {counts}; e.g. {sample}")
        for proc in (*fleet, stack.control_plane):
            proc.check_alive()
        if time.monotonic() > end:
            tails = "\n".join(f"--- {p.name}:\n{p.log_tail(15)}" for p in fleet)
            raise TimeoutError(f"{agent_id}: not done after {deadline:.0f}s: {counts}\n{tails}")
        await asyncio.sleep(POLL_SECONDS)


def log_complaints(procs: list[Proc]) -> None:
    """Note the warnings and errors the processes logged (the first few, and how many)."""
    # The processes log JSON lines (telemetry/logs.py).
    markers = ('"level": "warning"', '"level": "error"', '"level": "critical"')
    lines = [f"{p.name}: {line}" for p in procs for line in p.log_lines(*markers)]
    if lines:
        report.note(f"{len(lines)} warning/error log lines, e.g.:")
        for line in lines[:3]:
            report.note(f"  {line[:200]}")


async def unusual_logs(conn: asyncpg.Connection, agent_id: str) -> None:
    """Note runs whose log differs from the most common one (a retry, a park, a takeover)."""
    rows = await conn.fetch(LOG_SHAPES, agent_id)
    shapes = Counter(r["shape"] for r in rows)
    if len(shapes) <= 1:
        return
    usual = shapes.most_common(1)[0][0]
    odd = [r for r in rows if r["shape"] != usual]
    report.note(f"{len(odd)} of {len(rows)} runs have an unusual log; usual: {usual}")
    for r in odd[:3]:
        report.note(f"  run {r['run_id']} (epoch {r['lease_epoch']}, attempt {r['attempt']}):")
        report.note(f"    {r['shape']}")


async def _phase(
    stack: Stack, chan: grpc.aio.Channel, n_exec: int, runs: int, deadline: float
) -> Throughput:
    fleet = stack.executors(n_exec)
    try:
        for proc in fleet:
            await stack.control_plane.wait_log(f"executor {proc.name} connected", watch=proc)
        warm, agent_id = f"e2e-{n_exec}x-warmup", f"e2e-{n_exec}x"
        for name in (warm, agent_id):
            await api.publish_agent(chan, name, model="steps10", tools=["echo"])
        await api.start_runs(chan, warm, WARMUP_PER_EXECUTOR * n_exec, START_IN_FLIGHT)
        await wait_done(stack, warm, WARMUP_PER_EXECUTOR * n_exec, deadline, fleet)
        meter = stack.cpu_meter(fleet)
        await api.start_runs(chan, agent_id, runs, START_IN_FLIGHT)
        await wait_done(stack, agent_id, runs, deadline, fleet)
        report.note(f"{n_exec}x: {meter.summary()}")
        log_complaints([*fleet, stack.control_plane])
    finally:
        for proc in fleet:
            stack.procs.stop(proc)
    await unusual_logs(stack.conn, agent_id)
    span = await stack.conn.fetchrow(SPAN, agent_id)
    label = f"agentrun, {n_exec} executor{'s' if n_exec > 1 else ''}"
    return Throughput(label, runs, span["steps"], float(span["seconds"]))


async def agentrun_half(pg: BenchPostgres, runs: int, deadline: float) -> list[Throughput]:
    dsn = await pg.create_database("e2e")
    report.note(await durability(dsn))
    with workdir("e2e") as tmp, redis_url() as redis, Procs(tmp) as procs:
        model, model_port = await start_sandbox(procs, "model")
        providers, providers_port = await start_sandbox(procs, "providers")
        cp, cp_port = await start_control_plane(procs, dsn)
        conn = await asyncpg.connect(dsn)
        keys = await api.mint_keys(dsn)
        await set_workspace_cap(dsn)
        links = ExecutorLinks(
            cp_port, model_port, providers_port, redis, ECHO_UNLIMITED, keys.executor
        )
        stack = Stack(procs, cp, links, (model.pid, providers.pid), conn)
        try:
            async with api.channel(cp_port, keys.admin) as chan:
                return [await _phase(stack, chan, n, runs, deadline) for n in EXECUTOR_COUNTS]
        finally:
            await conn.close()


async def dbos_half(pg: BenchPostgres, workflows: int) -> Throughput | None:
    if not module_available("dbos"):
        report.note("DBOS half skipped: dbos is not installed (pip install dbos==3.4.0)")
        return None
    from bench import dbos_baseline  # optional dependency: only this half needs it

    dsn = await pg.create_database("e2e_dbos", migrated=False)
    meter = CpuMeter({"this process (DBOS)": [os.getpid()]}, rest="Postgres and other tenants")
    result = await asyncio.to_thread(dbos_baseline.measure, dsn, workflows)
    report.note(f"DBOS: {meter.summary()}")
    conn = await asyncpg.connect(dsn)
    try:
        steps = await conn.fetchval(dbos_baseline.RECORDED_STEPS)
    finally:
        await conn.close()
    label = f"DBOS {dbos_baseline.STEPS_PER_WORKFLOW}-step workflows"
    return Throughput(label, workflows, steps, result.seconds)


async def guarded_agentrun_half(
    pg: BenchPostgres, runs: int, deadline: float
) -> tuple[list[Throughput], Exception | None]:
    """The agentrun figures, or the failure (the DBOS half is still worth measuring)."""
    if not (module_available("executor.__main__") and module_available("sandbox.__main__")):
        report.note("agentrun half skipped: `python -m executor` or `python -m sandbox` missing")
        return [], None
    try:
        return await agentrun_half(pg, runs, deadline), None
    except Exception as exc:  # noqa: BLE001 - reported, then raised after the DBOS half
        report.note(f"agentrun half FAILED: {type(exc).__name__}: {exc}")
        return [], exc


def _print(ours: list[Throughput], dbos: Throughput | None) -> None:
    headers = ("", "runs", "step rows", "seconds", "runs/s", "steps/s")
    report.table(headers, [t.row() for t in (*ours, *([dbos] if dbos else []))])
    if len(ours) == 2:
        scale = ratio(ours[1].runs_per_second, ours[0].runs_per_second)
        report.note(f"4 vs 1 executors: {scale:.2f}x runs/s")
    for t in ours:
        r = ratio(t.steps_per_second, dbos.steps_per_second) if dbos else math.nan
        report.target(f"steps/s {t.label} / DBOS", r, f">= {TARGET:g}x", r >= TARGET)


async def main(quick: bool = False) -> None:
    runs = 100 if quick else 1000
    deadline = 300.0 if quick else 1200.0
    report.heading(f"e2e: {runs} steps10 runs (4 echo turns + answer) vs DBOS")
    async with bench_postgres() as pg:
        ours, failure = await guarded_agentrun_half(pg, runs, deadline)
        dbos = await dbos_half(pg, runs)
    _print(ours, dbos)
    if failure is not None:
        raise RuntimeError("the agentrun half of e2e failed (see above)") from failure


def run(quick: bool = False) -> None:
    asyncio.run(main(quick))
