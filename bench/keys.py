"""Concurrency keys (issue 45, item 3): a limit of 2 per customer with 50 customers x 20
runs, beside small customers starting a few runs each.

One workspace, one agent whose version declares `concurrency_key: {key: input.customer_id,
limit: 2}` (migrations/0050_concurrency_keys.sql). Simulated executors (bench/fairness.py's:
the real claim SQL, a fenced commit after HOLD seconds) claim against real Postgres; every
run is admitted through the store's own admission, so the key triggers run as in
production. Three phases, each on a fresh database, with the same small customers' arrivals
(SMALL customers x 2 runs at random moments of the window):

* "small alone": nothing else (the baseline time to start);
* "keyed backlog": 50 big customers' 20 runs each, admitted before the executors start
  and the arrivals begin;
* "no key": the same backlog and arrivals, the version declaring no key (what the key
  saves the small customers from).

Printed: the small customers' time to start (started_at - created_at, database clock); the
most runs of one big customer running at once, sampled all along and read afterwards from
the run log (each run's claim to its finish, most_at_once per key); and when the backlog was
done. The executors have room for what the key lets through: EXECUTORS x SLOTS = 160
slots, the big customers' 50 x 2 = 100 at most, and the small customers' arrivals ask for
about 40 (20 a second, 2 s each); the key keeps the backlog from taking the rest, so the
small customers' p99 stays near the baseline's. Without the key the backlog takes every
slot until it is done.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass

import asyncpg

from bench import report
from bench.fairness import SLOTS, SimExecutor, fair_claim, verdict
from bench.postgres import BenchPostgres, bench_postgres, durability
from bench.stats import percentile
from control_plane.store import runs
from control_plane.store.db import create_pool

EXECUTORS = 10
WS = "ws"
BIG_CUSTOMERS = 50
BIG_RUNS = 20
LIMIT = 2
SMALL = 50
SMALL_RUNS = 2
ARRIVALS = 5.0
# The arrivals begin this long after the executors start, in every phase: the backlog's
# first 100 granted runs, admitted earlier, are claimed first (oldest due first, as any
# workspace's are; ~0.5 s here), and a run arriving in that instant waits behind them.
SETTLE = 1.0
# A run's mean hold: a couple of model calls. Shorter holds make this 2-core machine's claim and
# commit throughput, not the keys, the limit (at 0.25 s the 100 big slots alone ask for
# 400 runs a second).
HOLD = 2.0
KEYED = {"key": "input.customer_id", "path": ["customer_id"], "limit": LIMIT}

SEED = (
    "INSERT INTO workspaces (workspace_id, max_concurrency) VALUES ($1, 100000)",
    "INSERT INTO agents (workspace_id, agent_id, latest_version) VALUES ($1, 'agent', 1)",
    "INSERT INTO agent_versions (workspace_id, agent_id, version, spec) "
    "VALUES ($1, 'agent', 1, $2::jsonb)",
)
# Every run's key, times (seconds since the phase began) and whether it is a big customer's.
RUN_LOG = """
SELECT input::jsonb ->> 'customer_id' AS customer,
       extract(epoch FROM created_at) AS created, extract(epoch FROM started_at) AS started,
       extract(epoch FROM finished_at) AS finished
FROM runs WHERE workspace_id = $1
"""
# The most runs of one customer running at once now.
PER_KEY_RUNNING = """
SELECT coalesce(max(n), 0) FROM (
    SELECT count(*) AS n FROM runs WHERE workspace_id = $1 AND status = 'running'
      AND input::jsonb ->> 'customer_id' LIKE 'big-%'
    GROUP BY input::jsonb ->> 'customer_id') k
"""


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most intervals open at one moment (one ending as another starts: not both)."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    most = now = 0
    for _, d in edges:
        now += d
        most = max(most, now)
    return most


class Executor(SimExecutor):
    """bench/fairness.py's simulated executor, holding each run HOLD seconds on average
    (from half to one and a half times it: model calls vary)."""

    rng = random.Random(3)

    def hold_seconds(self) -> float:
        return self.rng.uniform(HOLD / 2, HOLD * 1.5)


class KeyMonitor:
    """Samples the most runs of one big customer running at once."""

    def __init__(self, pool: asyncpg.pool.Pool) -> None:
        self.pool = pool
        self.peak = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.peak = max(self.peak, await self.pool.fetchval(PER_KEY_RUNNING, WS))
            await asyncio.sleep(0.01)


@dataclass(frozen=True)
class Phase:
    label: str
    small_waits: list[float]
    sampled_peak: int
    logged_peak: int
    backlog_done: float  # seconds from the phase's start to the backlog's last finish

    def row(self) -> list[str]:
        w = self.small_waits
        big = self.label != "small alone"
        return [
            self.label,
            str(len(w)),
            f"{percentile(w, 50):.3f}",
            f"{percentile(w, 99):.3f}",
            f"{max(w):.3f}",
            f"{self.sampled_peak} / {self.logged_peak}" if big else "-",
            f"{self.backlog_done:.1f}" if big else "-",
        ]


def admission(customer: str, i: int) -> runs.Admission:
    text = json.dumps({"customer_id": customer, "n": i})
    return runs.Admission(WS, "agent", 1, text, None, 50, 1_000_000, 300, 86400)


async def _backlog(pool: asyncpg.pool.Pool) -> None:
    """The big customers' runs, interleaved, each through admission (8 at a time)."""
    todo = [admission(f"big-{c}", i) for i in range(BIG_RUNS) for c in range(BIG_CUSTOMERS)]
    for at in range(0, len(todo), 8):
        await asyncio.gather(*(runs.insert_run(pool, a) for a in todo[at : at + 8]))


async def _arrivals(pool: asyncpg.pool.Pool, rng: random.Random) -> None:
    times = sorted(
        (rng.uniform(0, ARRIVALS), f"small-{c}") for c in range(SMALL) for _ in range(SMALL_RUNS)
    )
    began = time.monotonic()
    for i, (at, customer) in enumerate(times):
        await asyncio.sleep(max(0.0, at - (time.monotonic() - began)))
        await runs.insert_run(pool, admission(customer, i))


async def _all_done(pool: asyncpg.pool.Pool, deadline: float) -> None:
    query = "SELECT count(*) FROM runs WHERE workspace_id = $1 AND finished_at IS NULL"
    while time.monotonic() < deadline:
        if not await pool.fetchval(query, WS):
            return
        await asyncio.sleep(0.1)


async def phase(pg: BenchPostgres, label: str, backlog: bool, keyed: bool) -> Phase:
    dsn = await pg.create_database("keys_" + label.replace(" ", "_"))
    pool = await create_pool(dsn, min_size=4, max_size=8)
    claims = [await create_pool(dsn, min_size=1, max_size=1) for _ in range(EXECUTORS)]
    pools = [await create_pool(dsn, min_size=1, max_size=3) for _ in range(EXECUTORS)]
    try:
        spec = {"model": "steps10", **({"concurrency_key": KEYED} if keyed else {})}
        async with pool.acquire() as conn:
            await conn.execute(SEED[0], WS)
            await conn.execute(SEED[1], WS)
            await conn.execute(SEED[2], WS, json.dumps(spec))
        if backlog:
            await _backlog(pool)  # admitted before the executors start: all of it is there
        stop = asyncio.Event()
        executors = [
            Executor(f"executor-{i}", c, p, fair_claim)
            for i, (c, p) in enumerate(zip(claims, pools, strict=True))
        ]
        monitor = KeyMonitor(pool)
        background = [asyncio.create_task(x.run(stop)) for x in executors]
        background.append(asyncio.create_task(monitor.run(stop)))
        began = await pool.fetchval("SELECT extract(epoch FROM now())")
        await asyncio.sleep(SETTLE)
        await _arrivals(pool, random.Random(45))
        await _all_done(pool, time.monotonic() + 120)
        stop.set()
        await asyncio.gather(*background)
        rows = await pool.fetch(RUN_LOG, WS)
    finally:
        await asyncio.gather(pool.close(), *(p.close() for p in (*claims, *pools)))
    small = [float(r["started"] - r["created"]) for r in rows if r["customer"].startswith("small-")]
    spans: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        if r["customer"].startswith("big-") and r["started"] is not None:
            spans.setdefault(r["customer"], []).append((float(r["started"]), float(r["finished"])))
    logged = max((most_at_once(s) for s in spans.values()), default=0)
    done = max((e for s in spans.values() for _, e in s), default=float(began)) - float(began)
    # (from when the executors started)
    return Phase(label, small, monitor.peak, logged, done)


async def main(quick: bool) -> None:
    global BIG_CUSTOMERS, BIG_RUNS  # noqa: PLW0603 - the quick run's smaller backlog
    if quick:
        BIG_CUSTOMERS, BIG_RUNS = 20, 10
    report.heading(
        f"keys: limit {LIMIT} per customer, {BIG_CUSTOMERS} customers x {BIG_RUNS} runs, beside "
        f"{SMALL} small customers' {SMALL * SMALL_RUNS} runs over {ARRIVALS:g}s from +{SETTLE:g}s; "
        f"{EXECUTORS} executors x {SLOTS} slots, {HOLD:g}s a run"
    )
    async with bench_postgres() as pg:
        alone = await phase(pg, "small alone", backlog=False, keyed=True)
        keyed = await phase(pg, "keyed backlog", backlog=True, keyed=True)
        unkeyed = await phase(pg, "no key", backlog=True, keyed=False)
        report.note(await durability(await pg.create_database("keys_durability")))
    report.note("small customers' time to start, seconds (database clock); big peak: the most")
    report.note("runs of one big customer running at once, sampled / from the run log")
    headers = ("", "small runs", "p50 s", "p99 s", "max s", "big peak", "backlog done s")
    report.table(headers, [alone.row(), keyed.row(), unkeyed.row()])
    peak = max(keyed.sampled_peak, keyed.logged_peak)
    verdict(f"keyed: one customer's peak {peak} running", f"<= {LIMIT}", peak <= LIMIT)
    base, with_keys = percentile(alone.small_waits, 99), percentile(keyed.small_waits, 99)
    verdict(
        f"keyed: small p99 {with_keys:.3f}s vs {base:.3f}s alone",
        "+0.25s",
        with_keys <= base + 0.25,
    )


def run(quick: bool = False) -> None:
    asyncio.run(main(quick))
