"""Concurrency keys (issue 45, item 3): a limit of 2 per customer with 50 customers x 20
runs, beside small customers starting a few runs each.

One workspace, one agent whose version declares `concurrency_key: {key: input.customer_id,
limit: 2}` (migrations/0050_concurrency_keys.sql). Simulated executors (bench/fairness.py's:
the real claim SQL, a fenced commit after 1-3 s) claim against real Postgres; every run is
admitted through the store's own admission, so the key triggers run as in production. Each
phase on a fresh database, with the same small customers' arrivals (SMALL customers x 2
runs at random moments of the window, from SETTLE after the executors start):

* "small alone" (three times, interleaved with the others: the baseline and its own
  run-to-run spread on this shared machine, measured in the same run);
* "keyed backlog": 50 big customers' 20 runs each, admitted before the executors start;
* "agent cap, no key": the same backlog on a second agent capped at 100 running (what the
  key lets run: 50 x 2), its version declaring no key: the same load on the executors and
  the database (100 runs held, ~50 ending and ~50 claimed a second) with no key at all;
* "no key": the same backlog, no key and no cap (what the key saves the small customers
  from: the backlog takes every slot until it is done).

Printed: the small customers' time to start (started_at - created_at, database clock); the
most runs of one big customer running at once, sampled all along and read afterwards from
the run log (each run's claim to its finish, most_at_once per key); and when the backlog was
done, and the machine's load average then (other work shares it). The verdicts: never
more than 2 of a customer at once; the key's own cost (the keyed p99 against the agent
cap's, the same load without a key, within the baseline's spread); and "unchanged" (the
keyed p99 against the baseline's worst, within the baseline's spread).

Why a keyed p99 can sit above the baseline's (measured 2026-12-07, bench/RESULTS.md): not
the claim's order. A slot passed on makes its waiter due at the grant's moment, so granted
runs and new arrivals are claimed in the order they became due: of the big runs claimed
while a small run waited, none had been granted after that small run arrived (the table's
note counts them), and the big runs' own grant-to-claim wait has the small runs' wait's
distribution. Nor the key's own work: the agent cap phase (the same churn with no key)
lands in the same range run after run. What the small runs wait for is the claim and
commit rate of this shared 2-core machine under 100 held runs ending ~50 a second, and it
moves with the machine's load: with the load low, the keyed p99 is within the baseline's
own spread; in a load spike any phase's p99 doubles.
"""

from __future__ import annotations

import asyncio
import json
import os
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
# (Granted later, a run is due from its grant: claimed in turn with the arrivals.)
SETTLE = 1.0
# A run's mean hold: a couple of model calls. Shorter holds make this 2-core machine's claim and
# commit throughput, not the keys, the limit (at 0.25 s the 100 big slots alone ask for
# 400 runs a second).
HOLD = 2.0
KEYED = {"key": "input.customer_id", "path": ["customer_id"], "limit": LIMIT}
BASELINES = 3  # "small alone" phases, interleaved with the others: the baseline's spread
MODES = ("alone", "keyed", "capped", "open")
LABELS = {
    "alone": "small alone",
    "keyed": "keyed backlog",
    "capped": "agent cap, no key",
    "open": "no key",
}

SEED = (
    "INSERT INTO workspaces (workspace_id, max_concurrency) VALUES ($1, 100000)",
    "INSERT INTO agents (workspace_id, agent_id, latest_version) VALUES ($1, 'agent', 1)",
    "INSERT INTO agent_versions (workspace_id, agent_id, version, spec) "
    "VALUES ($1, 'agent', 1, $2::jsonb)",
    # The agent cap phase's big customers: capped at what the key lets run, no key.
    "INSERT INTO agents (workspace_id, agent_id, latest_version, max_concurrency) "
    "VALUES ($1, 'big', 1, $2)",
    """INSERT INTO agent_versions (workspace_id, agent_id, version, spec)
       VALUES ($1, 'big', 1, '{"model": "steps10"}')""",
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


def grants(spans: list[tuple[float, float, float]]) -> list[tuple[float, float]]:
    """(granted, claimed) of one key's runs (created, started, finished) under the key: the
    first LIMIT from their admission, each later one at the key's next end (slots pass on
    in that order: one waiter per end)."""
    started = sorted(spans, key=lambda s: s[1])
    ends = sorted(f for _, _, f in spans)
    return [
        (c if i < LIMIT else ends[i - LIMIT], b)
        for i, (c, b, _) in enumerate(started)
        if i < LIMIT or i - LIMIT < len(ends)
    ]


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
    mode: str
    small_waits: list[float]
    sampled_peak: int
    logged_peak: int
    backlog_done: float  # seconds from the phase's start to the backlog's last finish
    # Big runs claimed while a small run waited: how many, and how many of them had become
    # due (their slot granted) only after that small run arrived (0: FIFO).
    ahead: int = 0
    ahead_due_later: int = 0
    # Big runs' grant-to-claim seconds, granted while the small runs arrived.
    big_lags: tuple[float, ...] = ()
    # The machine's 1-minute load average as the arrivals ended (2 cores, shared).
    load: float = 0.0

    @property
    def p99(self) -> float:
        return percentile(self.small_waits, 99)

    def row(self) -> list[str]:
        w = self.small_waits
        big = self.mode != "alone"
        return [
            LABELS[self.mode],
            str(len(w)),
            f"{percentile(w, 50):.3f}",
            f"{self.p99:.3f}",
            f"{max(w):.3f}",
            f"{self.sampled_peak} / {self.logged_peak}" if big else "-",
            f"{self.backlog_done:.1f}" if big else "-",
            f"{self.load:.1f}",
        ]


def admission(customer: str, i: int, agent: str = "agent") -> runs.Admission:
    text = json.dumps({"customer_id": customer, "n": i})
    return runs.Admission(WS, agent, 1, text, None, 50, 1_000_000, 300, 86400)


async def _backlog(pool: asyncpg.pool.Pool, agent: str) -> None:
    """The big customers' runs, interleaved, each through admission (8 at a time)."""
    todo = [admission(f"big-{c}", i, agent) for i in range(BIG_RUNS) for c in range(BIG_CUSTOMERS)]
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


def _order(rows: list[asyncpg.Record]) -> tuple[int, int, tuple[float, ...]]:
    """The keyed phase's claim order, from the run log: big runs claimed while a small one
    waited (and how many became due after it arrived), and the big runs' grant-to-claim
    seconds while the small runs arrived."""
    keys: dict[str, list[tuple[float, float, float]]] = {}
    for r in rows:
        if r["customer"].startswith("big-") and r["started"] is not None:
            span = (float(r["created"]), float(r["started"]), float(r["finished"]))
            keys.setdefault(r["customer"], []).append(span)
    granted = [g for spans in keys.values() for g in grants(spans)]
    small = [
        (float(r["created"]), float(r["started"]))
        for r in rows
        if r["customer"].startswith("small-")
    ]
    ahead = [(g, c) for c, s in small for g, b in granted if c < b < s]
    first, last = min(c for c, _ in small), max(s for _, s in small)
    lags = tuple(b - g for g, b in granted if first <= g <= last)
    return len(ahead), sum(g > c for g, c in ahead), lags


async def phase(pg: BenchPostgres, mode: str, n: int = 0) -> Phase:
    dsn = await pg.create_database(f"keys_{mode}_{n}")
    pool = await create_pool(dsn, min_size=4, max_size=8)
    claims = [await create_pool(dsn, min_size=1, max_size=1) for _ in range(EXECUTORS)]
    pools = [await create_pool(dsn, min_size=1, max_size=3) for _ in range(EXECUTORS)]
    try:
        keyed = mode in ("alone", "keyed", "capped")  # the small customers' version
        spec = {"model": "steps10", **({"concurrency_key": KEYED} if keyed else {})}
        async with pool.acquire() as conn:
            await conn.execute(SEED[0], WS)
            await conn.execute(SEED[1], WS)
            await conn.execute(SEED[2], WS, json.dumps(spec))
            await conn.execute(SEED[3], WS, BIG_CUSTOMERS * LIMIT)
            await conn.execute(SEED[4], WS)
        if mode != "alone":
            # admitted before the executors start: all of it is there
            await _backlog(pool, "big" if mode == "capped" else "agent")
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
        load = os.getloadavg()[0]
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
    order = _order(rows) if mode == "keyed" else (0, 0, ())
    return Phase(mode, small, monitor.peak, logged, done, *order, load=load)


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
        # The baselines between the others: the spread covers the machine's load all along.
        alone, others = [], []
        for n, mode in enumerate(("keyed", "capped", "open")):
            alone.append(await phase(pg, "alone", n))
            others.append(await phase(pg, mode))
        report.note(await durability(await pg.create_database("keys_durability")))
    keyed, capped, _ = others
    report.note("small customers' time to start, seconds (database clock); big peak: the most")
    report.note("runs of one big customer running at once, sampled / from the run log")
    report.note("load: the machine's 1-minute load average as the arrivals ended (2 cores)")
    headers = ("", "small runs", "p50 s", "p99 s", "max s", "big peak", "backlog done s", "load")
    report.table(headers, [p.row() for p in (*alone, *others)])
    lags = list(keyed.big_lags) or [0.0]
    report.note(
        f"keyed: {keyed.ahead} big runs claimed while a small run waited, "
        f"{keyed.ahead_due_later} of them granted after it arrived; the big runs' grant to "
        f"claim meanwhile: p50 {percentile(lags, 50):.3f} s, p99 {percentile(lags, 99):.3f} s"
    )
    peak = max(keyed.sampled_peak, keyed.logged_peak)
    verdict(f"keyed: one customer's peak {peak} running", f"<= {LIMIT}", peak <= LIMIT)
    base = [p.p99 for p in alone]
    spread = max(base) - min(base)
    report.note(f"small alone p99: {', '.join(f'{b:.3f}' for b in base)} s (spread {spread:.3f} s)")
    verdict(
        f"key's own cost: p99 {keyed.p99:.3f}s vs {capped.p99:.3f}s capped",
        f"+{spread:.3f}s",
        keyed.p99 <= capped.p99 + spread,
    )
    verdict(
        f"unchanged: p99 {keyed.p99:.3f}s vs alone <= {max(base):.3f}s",
        f"+{spread:.3f}s",
        keyed.p99 <= max(base) + spread,
    )


def run(quick: bool = False) -> None:
    asyncio.run(main(quick))
