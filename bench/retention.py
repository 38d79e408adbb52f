"""Claim latency while the retention loop deletes 400k steps (quick: 100k), and without it.

Twice (--quick: the first only): runs of 50 steps each, then runs of 1,000 (the same steps in 20 times fewer runs: a
deleter that counts runs, not rows, does 20 times the work a statement there). One
database each: the bench workspace keeps finished runs 30 days and holds FINISHED runs
that finished 40 days ago with the scenario's steps each (bulk-loaded with generate_series, their
step_count set as every step-writing statement keeps it, then VACUUM ANALYZE), in BLOCKS
slices an hour apart. Single-claim latency is measured as in `bench claim` (insert one due
run, time one claim), in alternating blocks: a block with no deleter, then one while
control_plane.runs.retention (its defaults: statement size, rest between statements, step rows
a second) deletes the next slice until it is gone, and so on, and a last block with no
deleter. A block with no deleter between two with it takes as many claims as the one
before it, the first 1,000 (--quick: 200) and the last half the one before it: both p99s
come from series of about the same size (the one without was a fixed 1,000 claims
against 10-25k with, and its p99, the tenth-slowest claim, moved the ratio more than the
deleter did), and the claims without the deleter sit as much before those with it as
after. Claims slow down as the runs they insert accumulate (the p50 rose 15 % from the
first block to the last), so series placed unevenly in time would be compared across
that drift. Alternating, rather than all quiet claims first, puts both series under the
same moments of a shared machine's load. The deleter shares the
2 cores with Postgres and the claimer. Its throughput (runs and steps deleted per second of
deleting, rests included) is printed next to the ratio: a ratio bought by deleting slowly
shows there.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta

import asyncpg

from bench import report
from bench.claimers import seed
from bench.postgres import BenchPostgres, bench_postgres, foreign_keys_unchecked
from bench.stats import Summary, ratio
from control_plane.runs.retention import Retention
from control_plane.store.db import create_pool
from control_plane.store.lease import claim_due

STEPS_PER_RUN = (50, 1_000)  # the two scenarios
BLOCKS = 4
WARMUP = 20
TARGET = 1.5
KEEP_DAYS = 30

# Slice $3 of the finished runs: finished 40 days ago plus $3 hours.
INSERT_FINISHED = """
INSERT INTO runs (workspace_id, run_id, agent_id, agent_version, status, input, output,
                  max_steps, max_tokens, max_tool_calls, deadline_seconds, repeat_limit,
                  step_count, created_at, finished_at)
SELECT 'bench0', gen_random_uuid(), 'claim', 1, 'completed', 'bench', 'done', 100, 1000000,
       300, 86400, 3, $2::int, now() - interval '40 days',
       now() - interval '40 days' + make_interval(hours => $3::int) + g * interval '1 ms'
FROM generate_series(1, $1::int) AS g
"""
INSERT_STEPS = """
INSERT INTO steps (workspace_id, run_id, seq, kind, epoch, payload)
SELECT r.workspace_id, r.run_id, s, 'model_decision', 1, '{"content": "x"}'
FROM runs r, generate_series(0, $1::int - 1) AS s WHERE r.status = 'completed'
"""

# One run due now (bench.claimers' INSERT_RUNS predates repeat_limit's NOT NULL).
INSERT_QUEUED = """
INSERT INTO runs (workspace_id, run_id, agent_id, agent_version, wake_at, input, max_steps,
                  max_tokens, max_tool_calls, deadline_seconds, repeat_limit)
VALUES ('bench0', gen_random_uuid(), 'claim', 1, now(), 'bench', 50, 1000000, 300, 86400, 3)
"""


async def _claim_one(conn: asyncpg.Connection, pool: asyncpg.pool.Pool) -> float:
    await conn.execute(INSERT_QUEUED)
    start = time.perf_counter()
    rows = await claim_due(pool, ["bench-claimer"], 3600)
    elapsed = time.perf_counter() - start
    if len(rows) != 1:
        raise RuntimeError(f"a single claim took {len(rows)} runs")
    return elapsed


async def _load(dsn: str, conn: asyncpg.Connection, finished: int, per_run: int) -> datetime:
    """Load the finished runs in BLOCKS slices; returns when the first one finished."""
    await seed(dsn, 1)
    start = time.perf_counter()
    async with foreign_keys_unchecked(conn, "runs", "steps"):
        for block in range(BLOCKS):
            await conn.execute(INSERT_FINISHED, finished // BLOCKS, per_run, block)
        await conn.execute(INSERT_STEPS, per_run)
    await conn.execute(
        "UPDATE workspaces SET retention_days = $1 WHERE workspace_id = 'bench0'", KEEP_DAYS
    )
    await conn.execute("VACUUM ANALYZE")
    steps = finished * per_run
    report.note(
        f"loaded {finished:,} finished runs, {steps:,} steps in "
        f"{time.perf_counter() - start:.1f}s, {BLOCKS} slices"
    )
    return await conn.fetchval("SELECT min(finished_at) FROM runs WHERE status = 'completed'")


async def _busy_block(
    conn: asyncpg.Connection, pool: asyncpg.pool.Pool, now: datetime
) -> tuple[list[float], int, float]:
    """Claims while the deleter deletes what is due at `now`: latencies, runs, seconds."""
    start = time.perf_counter()
    deleter = asyncio.create_task(Retention(pool).tick(now=now))
    busy = []
    while not deleter.done():
        busy.append(await _claim_one(conn, pool))
    return busy, await deleter, time.perf_counter() - start


def _total_steps(quick: bool) -> int:
    # The deleter's 25,000 step rows a second (control_plane.runs.retention.STEPS_PER_SECOND)
    # take 16 s a scenario over 400k, and the blocks without it as long again.
    return 100_000 if quick else 400_000


async def _measure(
    pg: BenchPostgres, quick: bool, per_run: int
) -> tuple[list[float], list[float], float]:
    finished = _total_steps(quick) // per_run
    dsn = await pg.create_database(f"retention{per_run}")
    conn = await asyncpg.connect(dsn)
    pool = await create_pool(dsn, min_size=2, max_size=4)
    try:
        first = await _load(dsn, conn, finished, per_run)
        for _ in range(WARMUP):
            await _claim_one(conn, pool)
        quiet: list[float] = []
        busy: list[float] = []
        deleted, took = 0, 0.0
        rounds = 200 if quick else 1000  # the first block without the deleter
        for block in range(BLOCKS):
            quiet += [await _claim_one(conn, pool) for _ in range(rounds)]
            # Slice `block` is past its cutoff at this `now`; the later ones are not yet.
            now = first + timedelta(days=KEEP_DAYS, hours=block, minutes=30)
            claims, gone, seconds = await _busy_block(conn, pool, now)
            busy, deleted, took = busy + claims, deleted + gone, took + seconds
            rounds = len(claims)  # the next block without the deleter: as many claims
        quiet += [await _claim_one(conn, pool) for _ in range(rounds // 2)]
        if deleted != finished:
            raise RuntimeError(f"the deleter took {deleted:,} of {finished:,} runs")
        return quiet, busy, took
    finally:
        await pool.close()
        await conn.close()


async def _scenario(pg: BenchPostgres, quick: bool, per_run: int) -> None:
    steps = _total_steps(quick)
    report.heading(
        f"retention: single-claim latency while deleting {steps:,} steps, {per_run:,} a run"
    )
    quiet, busy, took = await _measure(pg, quick, per_run)
    a, b = Summary.of(quiet), Summary.of(busy)
    report.table(
        report.LATENCY_HEADERS,
        [report.latency_row("no deleter", a), report.latency_row("deleter running", b)],
    )
    report.note(
        f"the deleter took {took:.1f}s in {BLOCKS} blocks: "
        f"{steps // per_run / took:,.0f} runs/s, {steps / took:,.0f} steps/s; "
        f"{len(busy)} claims ran meanwhile"
    )
    r = ratio(b.p99, a.p99)
    report.target(
        f"claim p99 deleter/none, {per_run:,} steps/run", r, f"<= {TARGET:g}x", r <= TARGET
    )


async def main(quick: bool = False) -> None:
    # --quick keeps `make bench` short: the first scenario only.
    scenarios = STEPS_PER_RUN[:1] if quick else STEPS_PER_RUN
    if quick:
        report.note(
            f"--quick: {scenarios[0]} steps a run only (the full run also measures "
            f"{', '.join(f'{n:,}' for n in STEPS_PER_RUN[1:])})"
        )
    async with bench_postgres() as pg:
        for per_run in scenarios:
            await _scenario(pg, quick, per_run)


def run(quick: bool = False) -> None:
    asyncio.run(main(quick))
