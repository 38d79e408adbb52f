"""Claim latency while the retention loop deletes 1M steps (quick: 100k), and without it.

One database: the bench workspace keeps finished runs 30 days and holds FINISHED runs that
finished 40 days ago with STEPS_PER_RUN steps each (bulk-loaded with generate_series, then
VACUUM ANALYZE). Single-claim latency is measured as in `bench claim` (insert one due run,
time one claim) first with no deleter, then while control_plane.retention deletes the
backlog in batches of 500 runs per statement (FOR UPDATE SKIP LOCKED on finished runs only)
with the loop's default pause between batches, until the backlog is gone. The deleter shares the 2 cores with Postgres and the claimer.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg

from bench import report
from bench.claim import seed
from bench.postgres import BenchPostgres, bench_postgres, foreign_keys_unchecked
from bench.stats import Summary, ratio
from control_plane.retention import Retention
from control_plane.store.db import create_pool
from control_plane.store.lease import claim_due

STEPS_PER_RUN = 50
BATCH = 500
WARMUP = 20
TARGET = 1.5

INSERT_FINISHED = """
INSERT INTO runs (workspace_id, run_id, agent_id, agent_version, status, input, output,
                  max_steps, max_tokens, max_tool_calls, deadline_seconds, repeat_limit,
                  created_at, finished_at)
SELECT 'bench0', gen_random_uuid(), 'claim', 1, 'completed', 'bench', 'done', 100, 1000000,
       300, 86400, 3, now() - interval '40 days',
       now() - interval '40 days' + g * interval '1 ms'
FROM generate_series(1, $1::int) AS g
"""
INSERT_STEPS = """
INSERT INTO steps (workspace_id, run_id, seq, kind, epoch, payload)
SELECT r.workspace_id, r.run_id, s, 'model_decision', 1, '{"content": "x"}'
FROM runs r, generate_series(0, $1::int - 1) AS s WHERE r.status = 'completed'
"""

# One run due now (bench.claim's INSERT_RUNS predates repeat_limit's NOT NULL).
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


async def _load(dsn: str, conn: asyncpg.Connection, finished: int) -> None:
    await seed(dsn, 1)
    start = time.perf_counter()
    async with foreign_keys_unchecked(conn, "runs", "steps"):
        await conn.execute(INSERT_FINISHED, finished)
        await conn.execute(INSERT_STEPS, STEPS_PER_RUN)
    await conn.execute("UPDATE workspaces SET retention_days = 30 WHERE workspace_id = 'bench0'")
    await conn.execute("VACUUM ANALYZE")
    steps = finished * STEPS_PER_RUN
    report.note(f"loaded {finished:,} finished runs, {steps:,} steps in "
                f"{time.perf_counter() - start:.1f}s")  # fmt: skip


async def _measure(pg: BenchPostgres, quick: bool) -> tuple[list[float], list[float], float]:
    finished = 2_000 if quick else 20_000
    rounds = 200 if quick else 1000
    dsn = await pg.create_database("retention")
    conn = await asyncpg.connect(dsn)
    pool = await create_pool(dsn, min_size=2, max_size=4)
    try:
        await _load(dsn, conn, finished)
        quiet = [await _claim_one(conn, pool) for _ in range(WARMUP + rounds)][WARMUP:]
        start = time.perf_counter()
        deleter = asyncio.create_task(Retention(pool, batch=BATCH).tick())
        busy = []
        while not deleter.done():
            busy.append(await _claim_one(conn, pool))
        deleted, took = await deleter, time.perf_counter() - start
        if deleted != finished:
            raise RuntimeError(f"the deleter took {deleted:,} of {finished:,} runs")
        return quiet, busy, took
    finally:
        await pool.close()
        await conn.close()


async def main(quick: bool = False) -> None:
    steps = (2_000 if quick else 20_000) * STEPS_PER_RUN
    report.heading(f"retention: single-claim latency while deleting {steps:,} steps")
    async with bench_postgres() as pg:
        quiet, busy, took = await _measure(pg, quick)
    a, b = Summary.of(quiet), Summary.of(busy)
    report.table(
        report.LATENCY_HEADERS,
        [report.latency_row("no deleter", a), report.latency_row("deleter running", b)],
    )
    report.note(f"the deleter took {took:.1f}s ({BATCH} runs a statement); "
                f"{len(busy)} claims ran meanwhile")  # fmt: skip
    r = ratio(b.p99, a.p99)
    report.target("claim p99 with/without the deleter", r, f"<= {TARGET:g}x", r <= TARGET)


def run(quick: bool = False) -> None:
    asyncio.run(main(quick))
