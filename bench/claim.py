"""Claims: the fair claim against a raw SKIP LOCKED claim, and delivered as assignments.

Workspaces, agents and versions are made through the store; runs are bulk-loaded with
generate_series (a claim reads nothing else). Every bench workspace is on the enterprise plan
with a cap above the number of runs, so that caps never decide a figure.

Throughput at the store: 5k (quick: 2k) queued runs, in 1 workspace and then spread over
100; 2 claimers (what two control-plane replicas' dispatch loops are), each on its own
connection, claim until the runs are claimed (batch 1: a fifth of them), for batch sizes 1 and
64 (the dispatcher's batch); each fair row (control_plane/store/lease.py `claim_due`) right
after a raw row on the same reloaded table: one autocommit UPDATE of `LIMIT n FOR UPDATE SKIP
LOCKED` queued runs, no fairness, no caps (the table's triggers fire for both). The fair claim
locks the workspaces it serves, so a claimer can come back empty while others hold them: it
asks again 2 ms later, and those empty calls are counted.

Delivered (bench/claim_dispatch.py): the real control plane, 1 then 2 replicas, with
minimal executor streams counting Assignment messages, against the raw claim at the same
batch and concurrency. Depth: two databases on the same server, one with 10k parked runs
(waiting, wake_at in the future) and one with 1M; measurement rounds alternate between them:
insert one due run, time one single-run claim. VACUUM ANALYZE follows each bulk load, so the
measurement neither runs on stale statistics nor meets autovacuum catching up; the parked
runs are loaded without the per-row foreign-key checks (bench/postgres.py), which cost a
third of the million-run load and leave the same rows.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import asyncpg

from bench import report
from bench.postgres import BenchPostgres, bench_postgres, durability, foreign_keys_unchecked
from bench.stats import Summary, ratio
from control_plane.store import agents, workspaces
from control_plane.store.db import create_pool
from control_plane.store.lease import claim_due

CLAIMERS = 2
QUEUED = 5_000
LAYOUTS = (1, 100)  # workspaces the queued runs are spread over
BATCHES = (1, 64)
SHALLOW = 10_000
LOAD_CHUNK = 250_000
WARMUP = 20
TARGET = 1.5
TARGET_RAW = 0.5  # fair claim delivered / raw SKIP LOCKED, claims per second
CAP = 10_000_000
AGENT = "claim"
CLAIM_DEADLINE = 600.0
# Longer than any measurement: a lease lapsing mid-way would be claimed again, counted twice.
LEASE_SECONDS = 3600
# After an empty claim. A dispatcher would wait for a poke or its poll interval; spinning
# would only take the 2 cores from the claimer that holds the workspace.
EMPTY_BACKOFF = 0.002

# Run g goes to workspace bench<g mod $6>; wake_at spread over [now + $4, now + $4 + $5) s.
INSERT_RUNS = """
INSERT INTO runs (workspace_id, run_id, agent_id, agent_version, status, wait_reason, wake_at,
                  input, max_steps, max_tokens, max_tool_calls, deadline_seconds, repeat_limit)
SELECT 'bench' || (g % $6::int), gen_random_uuid(), 'claim', 1, $2::text, $3::text,
       now() + make_interval(secs => $4 + random() * $5),
       'bench', 50, 1000000, 300, 86400, 3
FROM generate_series(1, $1::int) AS g
"""
# The baseline: what a plain queue on the same table does, in one autocommit statement.
# It updates its runs in (workspace, run) order: the row trigger then moves the running
# counts of the workspaces in that order too, so two raw claimers wait for each other's
# count rows without deadlocking (unordered, a deadlock cost a claimer the 1 s
# deadlock_timeout and made the baseline look slow).
RAW_CLAIM = """
WITH picked AS (
    SELECT workspace_id, run_id FROM runs
    WHERE status IN ('queued', 'waiting') AND wake_at <= now()
    LIMIT $2 FOR UPDATE SKIP LOCKED
), ordered AS MATERIALIZED (
    SELECT workspace_id, run_id FROM picked ORDER BY workspace_id, run_id
)
UPDATE runs r SET status = 'running', wait_reason = NULL, lease_owner = $1,
    lease_epoch = r.lease_epoch + 1, wake_at = now() + make_interval(secs => $3),
    held_since = now(), started_at = coalesce(r.started_at, now()), updated_at = now()
FROM ordered WHERE r.workspace_id = ordered.workspace_id AND r.run_id = ordered.run_id
RETURNING r.*
"""
FAIR = "fair claim_due"
RAW = "raw SKIP LOCKED"


async def seed(dsn: str, n_workspaces: int) -> None:
    """Workspaces bench0..benchN-1, each with room for every run and the agent version."""
    pool = await create_pool(dsn, min_size=1, max_size=2)
    try:
        for i in range(n_workspaces):
            await workspaces.set_plan(pool, f"bench{i}", "enterprise", CAP)
            await agents.create_agent(pool, f"bench{i}", AGENT, AGENT)
            await agents.publish_version(pool, f"bench{i}", AGENT, {"model": "steps10"})
    finally:
        await pool.close()


async def insert_queued(conn: asyncpg.Connection, n: int, n_workspaces: int = 1) -> None:
    """n runs due now (admitted within the last minute)."""
    await conn.execute(INSERT_RUNS, n, "queued", None, -60.0, 60.0, n_workspaces)


async def insert_parked(conn: asyncpg.Connection, n: int) -> None:
    """n runs sleeping until some time between an hour and a day from now."""
    await conn.execute(INSERT_RUNS, n, "waiting", "sleep", 3600.0, 86400.0, 1)


async def reload_queued(conn: asyncpg.Connection, queued: int, n_workspaces: int) -> None:
    """An empty runs table, then `queued` due runs, with fresh statistics."""
    await conn.execute("TRUNCATE runs CASCADE")
    await insert_queued(conn, queued, n_workspaces)
    await conn.execute("VACUUM ANALYZE runs")


@dataclass
class Tally:
    """What the claimers of one measurement did together."""

    target: int
    claimed: int = 0
    empty: int = 0
    calls: list[float] = field(default_factory=list)  # of the calls that got runs


Claim = Callable[[asyncpg.pool.Pool, str, int], Awaitable[int]]


async def fair_claim(pool: asyncpg.pool.Pool, owner: str, batch: int) -> int:
    return len(await claim_due(pool, [owner] * batch, LEASE_SECONDS))


RAW_DEADLOCKS = [0]


async def raw_claim(pool: asyncpg.pool.Pool, owner: str, batch: int) -> int:
    """The raw claim; 0 when Postgres broke a deadlock by aborting it (counted), as a queue
    would simply ask again. Two raw claims that updated runs of several workspaces in
    different orders could deadlock in the trigger that keeps each workspace's running
    count; RAW_CLAIM's order should prevent it, and the count says if it did not."""
    try:
        return len(await pool.fetch(RAW_CLAIM, owner, batch, float(LEASE_SECONDS)))
    except asyncpg.exceptions.DeadlockDetectedError:
        RAW_DEADLOCKS[0] += 1
        return 0


async def _claimer(pool: asyncpg.pool.Pool, claim: Claim, owner: str, batch: int,
                   tally: Tally) -> None:  # fmt: skip
    give_up = time.monotonic() + CLAIM_DEADLINE
    while tally.claimed < tally.target:
        start = time.perf_counter()
        got = await claim(pool, owner, batch)
        elapsed = time.perf_counter() - start
        tally.claimed += got
        if got:
            tally.calls.append(elapsed)
        else:
            tally.empty += 1
            await asyncio.sleep(EMPTY_BACKOFF)
        if time.monotonic() > give_up:
            raise TimeoutError(f"{tally.claimed} of {tally.target} runs claimed")


async def claim_rate(
    dsn: str,
    claim: Claim,
    claimers: int,
    batch: int,
    target: int,
    done: Callable[[], object] | None = None,
) -> tuple[Tally, float]:
    """`claimers` concurrent claimers, each on its own connection, until `target` are claimed;
    the tally and the seconds it took. `done` is called when they are, before their
    connections close (a CPU meter stopped then still sees their Postgres backends)."""
    pools = [await create_pool(dsn, min_size=1, max_size=1) for _ in range(claimers)]
    tally = Tally(target)
    try:
        start = time.perf_counter()
        await asyncio.gather(
            *(_claimer(p, claim, f"claimer-{i}", batch, tally) for i, p in enumerate(pools))
        )
        elapsed = time.perf_counter() - start
        if done is not None:
            done()
    finally:
        await asyncio.gather(*(p.close() for p in pools))
    return tally, elapsed


async def _pair(
    conn: asyncpg.Connection, dsn: str, n_workspaces: int, batch: int, queued: int
) -> list[list[str]]:
    """Raw, then fair, on the same freshly loaded table; the rows to print."""
    target = queued if batch > 1 else queued // 5
    where = f"{n_workspaces} workspace{'s' if n_workspaces > 1 else ''}, batch {batch}"
    rows: list[list[str]] = []
    rates: dict[str, float] = {}
    for label, claim in ((RAW, raw_claim), (FAIR, fair_claim)):
        await reload_queued(conn, queued, n_workspaces)
        tally, elapsed = await claim_rate(dsn, claim, CLAIMERS, batch, target)
        s = Summary.of(tally.calls)
        rates[label] = tally.claimed / elapsed
        rows.append([f"{where}: {label}", str(tally.claimed), f"{elapsed:.2f}",
                     f"{rates[label]:,.0f}", str(tally.empty),
                     report.ms(s.p50), report.ms(s.p99)])  # fmt: skip
    rows[-1].append(f"{ratio(rates[FAIR], rates[RAW]):.2f}x")
    rows[0].append("")
    return rows


async def throughput(pg: BenchPostgres, quick: bool) -> None:
    queued = 2_000 if quick else QUEUED
    report.heading(f"claim: at the store, {queued:,} queued runs, {CLAIMERS} concurrent claimers")
    report.note(f"raw: one UPDATE of LIMIT n FOR UPDATE SKIP LOCKED runs (no fairness, no caps);"
                f" fair: claim_due, the dispatcher's claim; batch 1 claims {queued // 5:,}")  # fmt: skip
    rows: list[list[str]] = []
    for n_workspaces in LAYOUTS:
        dsn = await pg.create_database(f"claim_throughput_{n_workspaces}")
        conn = await asyncpg.connect(dsn)
        try:
            if not rows:
                report.note(await durability(dsn))
            await seed(dsn, n_workspaces)
            for b in BATCHES:
                rows += await _pair(conn, dsn, n_workspaces, b, queued)
        finally:
            await conn.close()
    headers = ("", "claimed", "seconds", "claims/s", "empty calls", "p50 ms", "p99 ms",
               "fair/raw")  # fmt: skip
    report.table(headers, rows)
    report.note("p50/p99: latency of the claim calls that got runs; empty calls include the")
    report.note(f"raw claims Postgres aborted as deadlocked: {RAW_DEADLOCKS[0]} so far")


class DepthDatabase:
    """A database with `parked` sleeping runs, and one claimer connection to it."""

    def __init__(self, parked: int) -> None:
        self.parked = parked
        self.samples: list[float] = []
        self._conn: asyncpg.Connection | None = None
        self._pool: asyncpg.pool.Pool | None = None

    async def load(self, pg: BenchPostgres) -> None:
        dsn = await pg.create_database(f"claim_parked_{self.parked}")
        self._conn = await asyncpg.connect(dsn)
        self._pool = await create_pool(dsn, min_size=1, max_size=1)
        await seed(dsn, 1)
        start = time.perf_counter()
        async with foreign_keys_unchecked(self._conn, "runs") as unchecked:
            for done in range(0, self.parked, LOAD_CHUNK):
                await insert_parked(self._conn, min(LOAD_CHUNK, self.parked - done))
        await self._conn.execute("VACUUM ANALYZE runs")
        how = " (foreign keys unchecked, other triggers on)" if unchecked else ""
        report.note(
            f"loaded {self.parked:,} parked runs in {time.perf_counter() - start:.1f}s{how}"
        )

    async def claim_one(self, record: bool = True) -> None:
        """Make one run due, then time a single claim (which must take it)."""
        assert self._conn is not None and self._pool is not None
        await insert_queued(self._conn, 1)
        start = time.perf_counter()
        rows = await claim_due(self._pool, ["bench-claimer"], 3600)
        elapsed = time.perf_counter() - start
        if len(rows) != 1:
            raise RuntimeError(f"a single claim with {self.parked:,} parked took {len(rows)} runs")
        if record:
            self.samples.append(elapsed)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
        if self._conn is not None:
            await self._conn.close()


async def depth(pg: BenchPostgres, quick: bool) -> None:
    deep_n = 30_000 if quick else 1_000_000
    rounds = 100 if quick else 1000
    report.heading(f"claim: single-claim latency, {SHALLOW:,} vs {deep_n:,} parked runs")
    shallow, deep = DepthDatabase(SHALLOW), DepthDatabase(deep_n)
    try:
        for db in (shallow, deep):
            await db.load(pg)
        for i in range(WARMUP + rounds):
            # Alternate which goes first so neither always follows the other's write.
            pair = (shallow, deep) if i % 2 else (deep, shallow)
            for db in pair:
                await db.claim_one(record=i >= WARMUP)
    finally:
        await shallow.close()
        await deep.close()
    a, b = Summary.of(shallow.samples), Summary.of(deep.samples)
    report.table(
        report.LATENCY_HEADERS,
        [report.latency_row(f"{SHALLOW:,} parked", a), report.latency_row(f"{deep_n:,} parked", b)],
    )
    r = ratio(b.p99, a.p99)
    report.target(f"claim p99 {deep_n:,}/{SHALLOW:,} parked", r, f"<= {TARGET:g}x", r <= TARGET)


async def main(quick: bool = False) -> None:
    from bench import claim_dispatch  # it builds on this module's loaders and raw claim

    async with bench_postgres() as pg:
        await throughput(pg, quick)
        await claim_dispatch.delivered(pg, quick)
        await depth(pg, quick)


def run(quick: bool = False) -> None:
    asyncio.run(main(quick))
