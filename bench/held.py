"""Held runs: how many working runs one executor holds, and what each costs while it waits.

Every run here waits on a slow model (the sandbox model server, its scenario's latency on
every call). One control plane, one executor (AGENTRUN_CAPACITY = the runs held, so that
nothing queues behind the executor's credit), Redis, all real processes; a fresh database
and fresh processes for every phase, so that no phase inherits another's memory or runs.

A holding phase per size N, then an acting phase at the largest (each phase at thousands
of runs takes minutes on two cores, mostly admitting them):

* holding: N runs whose one model call takes HOLD_LATENCY (longer than the phase). Once
  all N are running, a window of HOLD_WINDOW seconds (two heartbeat intervals) in which
  nothing happens but holding: the executor's RSS above its own before the runs (per held
  run), and the CPU of the control plane (its heartbeats and pings), of the executor and
  of Postgres, as % of one core.
* acting: N runs of ACT_TURNS echo turns, every model call 5-10 s. Once all N are running,
  a window of ACT_WINDOW seconds: the actions (model_decision + tool_result steps) written
  in it and the CPU per action of agentrun's own processes (control plane + executor) and
  of the platform (+ Postgres + Redis), set beside the same figure at REFERENCE (256) runs
  measured in the same invocation.

--quick: 1,000 runs only (holding, then acting), and 256 for the reference.
BENCH_HELD_SIZES=5000 (comma-separated) picks the sizes instead, e.g. to redo one.
The machine is shared: CPU figures move with the other tenants' load.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from bench import api, report
from bench.cpu import CpuMeter, process_cpu
from bench.postgres import BenchPostgres, bench_postgres
from bench.procs import Proc, Procs, workdir
from bench.redis_server import redis_server
from bench.services import ExecutorLinks, start_control_plane, start_executor, start_sandbox
from bench.stats import ratio
from control_plane.store import workspaces
from control_plane.store.db import create_pool

SIZES = (1000, 5000, 10000)
SIZES_QUICK = (1000,)
REFERENCE = 256  # the e2e benchmark's executor capacity the CPU per action is set beside
HOLD_LATENCY_MS = 240_000  # a model call outlasting the holding phase (admission included)
SETTLE_MAX = 45.0
SETTLED_CPU = 0.05  # CPU seconds a second: the executor is holding, no longer starting runs
HOLD_WINDOW = 21.0  # two heartbeat intervals (10 s) and a bit
HOLD_WINDOW_QUICK = 11.0
IDLE_SETTLE = 5.0
ACT_LATENCY_MS = (5_000, 10_000)
ACT_TURNS = 12  # echo turns before the answer: a run outlasts the window
ACT_WINDOW = 20.0
ACT_WINDOW_QUICK = 12.0
START_IN_FLIGHT = 100
ECHO_UNLIMITED = "echo=1000000/s,echo.global=1000000/s"
TARGET_RSS = 20 * 1024  # bytes a held run
TARGET_HEARTBEAT = 0.05  # of one core, the control plane's, at the largest size
TARGET_ACTION = 1.2  # CPU per action at the largest size / at REFERENCE

RUNNING = "SELECT count(*) FROM runs WHERE agent_id = $1 AND status = 'running'"
BAD = "SELECT count(*) FROM runs WHERE agent_id = $1 AND status IN ('failed', 'cancelled')"
NOW = "SELECT clock_timestamp()"
ACTIONS_SINCE = """
SELECT count(*) FROM steps s JOIN runs r USING (workspace_id, run_id)
WHERE r.agent_id = $1 AND s.kind IN ('model_decision', 'tool_result') AND s.created_at >= $2
"""

CP, EXECUTOR, POSTGRES, REDIS = "control plane", "executor", "Postgres", "Redis"


def scenarios(directory: Path) -> Path:
    """The two slow scenarios, written where the model server reads them."""
    echo = {"tool_calls": [{"name": "echo", "arguments": {"text": {"$nonce": True}}}]}
    files = {
        "held_wait": {
            "description": "bench/held.py: one model call longer than the holding phase",
            "latency_ms": [HOLD_LATENCY_MS, HOLD_LATENCY_MS],
            "turns": [{"content": "done"}],
        },
        "held_slow": {
            "description": "bench/held.py: echo turns, every model call 5-10 s",
            "latency_ms": list(ACT_LATENCY_MS),
            "turns": [echo] * ACT_TURNS + [{"content": "done"}],
        },
    }
    for name, body in files.items():
        (directory / f"{name}.json").write_text(json.dumps(body))
    return directory


def rss(pid: int) -> int:
    """Resident set size of a live process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@dataclass(frozen=True)
class Holding:
    runs: int
    admit_seconds: float
    window: float
    rss_before: int
    rss_held: int
    cpu: dict[str, float]
    # The control plane's CPU over a window of the same length before any run was
    # admitted (its pollers: claims, outbox, max age, expiries), as a fraction of a core.
    idle: float = math.nan

    @property
    def rss_per_run(self) -> float:
        return ratio(self.rss_held - self.rss_before, self.runs)

    def core(self, group: str) -> float:
        """That group's CPU over the window as a fraction of one core."""
        return ratio(self.cpu.get(group, math.nan), self.window)


@dataclass(frozen=True)
class Acting:
    runs: int
    window: float
    actions: int
    cpu: dict[str, float]

    @property
    def own(self) -> float:
        return ratio(self.cpu[CP] + self.cpu[EXECUTOR], self.actions)

    @property
    def platform(self) -> float:
        extra = self.cpu.get(POSTGRES, math.nan) + self.cpu.get(REDIS, 0.0)
        return ratio(self.cpu[CP] + self.cpu[EXECUTOR] + extra, self.actions)


@dataclass
class Stack:
    procs: Procs
    conn: asyncpg.Connection
    chan_port: int
    admin_key: str
    control_plane: Proc
    executor: Proc
    groups: dict[str, list[int]]
    trees: dict[str, int]

    def meter(self) -> CpuMeter:
        return CpuMeter(self.groups, "sandbox, this process and other tenants", self.trees)


async def _stack(
    pg: BenchPostgres,
    procs: Procs,
    name: str,
    ports: tuple[int, int],
    redis: tuple[str, int | None],
    capacity: int,
) -> Stack:
    dsn = await pg.create_database(name)
    cp, cp_port = await start_control_plane(procs, dsn, name=f"cp_{name}")
    keys = await api.mint_keys(dsn)
    pool = await create_pool(dsn, min_size=1, max_size=1)
    try:  # the plan must not cap the runs held
        await workspaces.set_plan(pool, api.WORKSPACE, "enterprise", capacity + 64)
    finally:
        await pool.close()
    links = ExecutorLinks(cp_port, *ports, redis[0], ECHO_UNLIMITED, keys.executor)
    executor = start_executor(
        procs, f"held-{name}", links, capacity, AGENTRUN_MODEL_TIMEOUT_SECONDS="600"
    )
    await cp.wait_log(f"executor held-{name} connected", watch=executor)
    groups = {CP: [cp.pid], EXECUTOR: [executor.pid]}
    if redis[1] is not None:
        groups[REDIS] = [redis[1]]
    trees = {POSTGRES: pg.server_pid} if pg.server_pid is not None else {}
    conn = await asyncpg.connect(dsn)
    return Stack(procs, conn, cp_port, keys.admin, cp, executor, groups, trees)


async def _stop(stack: Stack) -> None:
    await stack.conn.close()
    stack.procs.stop(stack.executor)
    stack.procs.stop(stack.control_plane)


async def _admit(stack: Stack, agent: str, model: str, n: int, deadline: float) -> float:
    """Start n runs of `model` and wait until all are running; the seconds that took."""
    began = time.monotonic()
    async with api.channel(stack.chan_port, stack.admin_key) as chan:
        await api.publish_agent(chan, agent, model=model, tools=["echo"])
        await api.start_runs(chan, agent, n, START_IN_FLIGHT)
    while await stack.conn.fetchval(RUNNING, agent) < n:
        if bad := await stack.conn.fetchval(BAD, agent):
            raise RuntimeError(f"{agent}: {bad} runs failed or were cancelled")
        stack.executor.check_alive()
        stack.control_plane.check_alive()
        if time.monotonic() - began > deadline:
            running = await stack.conn.fetchval(RUNNING, agent)
            raise TimeoutError(f"{agent}: {running} of {n} running after {deadline:.0f}s")
        await asyncio.sleep(0.2)
    return time.monotonic() - began


async def _settled(executor: Proc) -> None:
    """Wait (at most SETTLE_MAX seconds) until the executor is quiet: a run counts as running
    once claimed, and the executor may still be starting the last ones' loops and calls."""
    end = time.monotonic() + SETTLE_MAX
    while time.monotonic() < end:
        before = process_cpu(executor.pid)
        await asyncio.sleep(1.0)
        if process_cpu(executor.pid) - before < SETTLED_CPU:
            return
    report.note(f"the executor was still busy {SETTLE_MAX:.0f}s after its runs were admitted")


async def holding(stack: Stack, n: int, window: float, idle_too: bool = False) -> Holding:
    idle = math.nan
    if idle_too:  # the control plane with nothing held: what holding adds is the rest
        await asyncio.sleep(IDLE_SETTLE)  # past its start-up (first claims, caches)
        meter = stack.meter()
        await asyncio.sleep(window)
        idle = ratio(meter.stop()[CP], window)
    rss_before = rss(stack.executor.pid)
    admitted = await _admit(stack, f"held-wait-{n}", "held_wait", n, 600.0)
    await _settled(stack.executor)
    meter = stack.meter()
    await asyncio.sleep(window)
    cpu = meter.stop()
    report.note(f"holding {n:,}: {meter.summary()}")
    if bad := await stack.conn.fetchval(BAD, f"held-wait-{n}"):
        raise RuntimeError(f"{bad} held runs failed while waiting")
    return Holding(n, admitted, window, rss_before, rss(stack.executor.pid), cpu, idle)


async def acting(stack: Stack, n: int, window: float) -> Acting:
    agent = f"held-slow-{n}"
    await _admit(stack, agent, "held_slow", n, 600.0)
    since = await stack.conn.fetchval(NOW)
    meter = stack.meter()
    await asyncio.sleep(window)
    cpu = meter.stop()
    actions = await stack.conn.fetchval(ACTIONS_SINCE, agent, since)
    report.note(f"acting {n:,}: {meter.summary()}")
    return Acting(n, window, actions, cpu)


def _print(holds: list[Holding], acts: list[Acting]) -> None:
    report.table(
        (
            "held runs",
            "admitted in s",
            "RSS/held run",
            "cp CPU",
            "executor CPU",
            "Postgres CPU",
            "Redis CPU",
        ),
        [
            [
                f"{h.runs:,}",
                f"{h.admit_seconds:.1f}",
                f"{h.rss_per_run / 1024:.1f} KiB",
                *(f"{100 * h.core(g):.1f}% core" for g in (CP, EXECUTOR, POSTGRES, REDIS)),
            ]
            for h in holds
        ],
    )
    report.note("holding: every run waits on one model call longer than the window; RSS/held")
    report.note("run = the executor's RSS growth from before its runs / runs; CPU over the window")
    report.table(
        (
            "running runs",
            "window s",
            "actions",
            "actions/s",
            "own CPU ms/action",
            "platform ms/action",
        ),
        [
            [
                f"{a.runs:,}",
                f"{a.window:.0f}",
                str(a.actions),
                f"{ratio(a.actions, a.window):,.0f}",
                f"{a.own * 1000:.2f}",
                f"{a.platform * 1000:.2f}",
            ]
            for a in acts
        ],
    )
    report.note("acting: every model call 5-10 s; own = control plane + executor; platform =")
    report.note("own + Postgres (server and backends) + Redis")
    top = max(holds, key=lambda h: h.runs)
    report.target(
        f"RSS per held run at {top.runs:,}",
        top.rss_per_run / 1024,
        f"<= {TARGET_RSS // 1024} KiB",
        top.rss_per_run <= TARGET_RSS,
        " KiB",
    )
    beat = top.core(CP)
    report.target(
        f"control-plane CPU holding {top.runs:,} runs, of a core",
        100 * beat,
        f"<= {100 * TARGET_HEARTBEAT:g}%",
        beat <= TARGET_HEARTBEAT,
        "%",
    )
    report.note(
        f"the control plane with no run held: {100 * top.idle:.1f}% of a core (its pollers), "
        "over a window as long, just before the runs were admitted"
    )
    ref = next((a for a in acts if a.runs == REFERENCE), None)
    big = max(acts, key=lambda a: a.runs)
    if ref is not None and big is not ref:
        r = ratio(big.platform, ref.platform)
        report.target(
            f"platform CPU/action at {big.runs:,} / at {REFERENCE}",
            r,
            f"<= {TARGET_ACTION:g}x",
            r <= TARGET_ACTION,
        )


async def main(quick: bool = False) -> None:
    asked = os.environ.get("BENCH_HELD_SIZES", "")
    sizes = tuple(int(n) for n in asked.split(",") if n.strip()) or (
        SIZES_QUICK if quick else SIZES
    )
    report.heading(
        f"held: runs waiting on a slow model, {', '.join(f'{n:,}' for n in sizes)} "
        "held by one executor"
    )
    report.note("the machine is shared with other tenants: figures are noisy")
    holds: list[Holding] = []
    acts: list[Acting] = []
    with workdir("held") as tmp, tempfile.TemporaryDirectory() as scen:
        async with bench_postgres() as pg:
            with Procs(tmp) as procs, redis_server() as redis:
                _, model_port = await start_sandbox(
                    procs, "model", "--scenarios", str(scenarios(Path(scen)))
                )
                _, providers_port = await start_sandbox(procs, "providers")
                plan = [("act", REFERENCE)] + [("hold", n) for n in sizes] + [("act", max(sizes))]
                for kind, n in plan:
                    stack = await _stack(
                        pg, procs, f"{kind}_{n}", (model_port, providers_port), redis, n
                    )
                    try:
                        if kind == "hold":
                            window = HOLD_WINDOW_QUICK if quick else HOLD_WINDOW
                            holds.append(await holding(stack, n, window, n == max(sizes)))
                        else:
                            window = ACT_WINDOW_QUICK if quick else ACT_WINDOW
                            acts.append(await acting(stack, n, window))
                    finally:
                        await _stop(stack)
    _print(holds, acts)


def run(quick: bool = False) -> None:
    asyncio.run(main(quick))
