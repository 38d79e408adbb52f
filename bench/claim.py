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

The loaders, both claims and the claimers are bench/claimers.py's.

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

import asyncpg

from bench import claim_dispatch, report
from bench.claimers import (
    LAYOUTS,
    RAW_DEADLOCKS,
    claim_rate,
    fair_claim,
    insert_parked,
    insert_queued,
    plain_claim,
    raw_claim,
    reload_plain,
    reload_queued,
    seed,
)
from bench.postgres import BenchPostgres, bench_postgres, durability, foreign_keys_unchecked
from bench.stats import Summary, ratio
from control_plane.store.db import create_pool
from control_plane.store.lease import claim_due

CLAIMERS = 2
QUEUED = 5_000
BATCHES = (1, 64)
SHALLOW = 10_000
LOAD_CHUNK = 250_000
WARMUP = 20
TARGET = 1.5
FAIR = "fair claim_due"
RAW = "raw SKIP LOCKED"
PLAIN = "plain queue table"
TARGET_PLAIN = 0.5  # fair claims/s / the plain queue table's, batch 64
PLAIN_RATIOS: list[tuple[str, float]] = []


async def _pair(
    conn: asyncpg.Connection, dsn: str, n_workspaces: int, batch: int, queued: int
) -> list[list[str]]:
    """Raw, then fair, on the same freshly loaded table; the rows to print."""
    target = queued if batch > 1 else queued // 5
    where = f"{n_workspaces} workspace{'s' if n_workspaces > 1 else ''}, batch {batch}"
    rows: list[list[str]] = []
    rates: dict[str, float] = {}
    for label, claim in ((PLAIN, plain_claim), (RAW, raw_claim), (FAIR, fair_claim)):
        if label == PLAIN:
            await reload_plain(conn, queued)
        else:
            await reload_queued(conn, queued, n_workspaces)
        tally, elapsed = await claim_rate(dsn, claim, CLAIMERS, batch, target)
        s = Summary.of(tally.calls)
        rates[label] = tally.claimed / elapsed
        rows.append(
            [
                f"{where}: {label}",
                str(tally.claimed),
                f"{elapsed:.2f}",
                f"{rates[label]:,.0f}",
                str(tally.empty),
                report.ms(s.p50),
                report.ms(s.p99),
            ]
        )
    rows[-1].append(f"{ratio(rates[FAIR], rates[RAW]):.2f}x")
    rows[-1].append(f"{ratio(rates[FAIR], rates[PLAIN]):.2f}x")
    rows[0] += ["", ""]
    rows[1] += ["", ""]
    PLAIN_RATIOS.append((where, ratio(rates[FAIR], rates[PLAIN])))
    return rows


async def throughput(pg: BenchPostgres, quick: bool) -> None:
    queued = 2_000 if quick else QUEUED
    report.heading(f"claim: at the store, {queued:,} queued runs, {CLAIMERS} concurrent claimers")
    report.note(
        f"raw: one UPDATE of LIMIT n FOR UPDATE SKIP LOCKED runs (no fairness, no caps);"
        f" fair: claim_due, the dispatcher's claim; batch 1 claims {queued // 5:,}"
    )
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
    headers = (
        "",
        "claimed",
        "seconds",
        "claims/s",
        "empty calls",
        "p50 ms",
        "p99 ms",
        "fair/raw",
        "fair/plain",
    )
    report.table(headers, rows)
    report.note(
        "plain queue table: (id, due, status, lease) and a partial index on due, no trigger,"
        " claimed by UPDATE ... WHERE id IN (SELECT ... ORDER BY due LIMIT n FOR UPDATE SKIP"
        " LOCKED); raw: the same claim on agentrun's runs table (its triggers and count rows);"
        " fair: claim_due (fairness, caps, priority, release routing)"
    )
    for where, r in PLAIN_RATIOS:
        if where.endswith("batch 64"):
            report.target(
                f"claims/s fair / plain, {where}", r, f">= {TARGET_PLAIN:g}x", r >= TARGET_PLAIN
            )
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
    async with bench_postgres() as pg:
        await throughput(pg, quick)
        await claim_dispatch.delivered(pg, quick)
        await depth(pg, quick)


def run(quick: bool = False) -> None:
    asyncio.run(main(quick))
