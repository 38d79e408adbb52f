"""A commit that renews the lease on every call against one that renews it only when it must.

`python -m bench.commit_hot [--quick]`. Every plain commit of a running run used to set
runs.wake_at = now() + lease. wake_at is indexed (runs_leases, the claim's index of held
runs), so each commit was a non-HOT update that wrote new index entries. A commit now
renews only once half the lease or less is left (store/sql/lease.sql, "Renewing on commit"),
for executors that read renewals off the result; older executors still renew on every one
(CommitRequest.renew_always), which is the "every commit renews" series below.

Both series run the same fenced statement through the same kind of pool (one connection,
autocommit, as the control plane sends a lone commit), one model_decision step at a time,
round robin over their own held runs, in alternating blocks so that noise from other
tenants of the machine falls on both alike. The runs table also holds parked runs, so the
indexes have the size of a busy one. Two more series repeat both with synchronous_commit off,
to show the statement's own cost without the WAL flush that dominates it. For each series: latency p50/p99, from
pg_stat_user_tables the updates of `runs` and how many of them were HOT, and the WAL each
commit wrote (index entries are WAL too; a block's WAL includes the two statistics reads).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field

import asyncpg

from bench import report
from bench.postgres import bench_postgres, durability
from bench.stats import Summary
from control_plane.store import agents, workspaces
from control_plane.store import steps as step_store
from control_plane.store.db import create_pool
from control_plane.store.lease import claim_due
from control_plane.store.runs import Run

LEASE_SECONDS = 30.0  # the default lease: half of it outlasts the whole measurement
WORKSPACE, AGENT = "hot", "hot"
HELD = 32  # runs each series commits to, round robin
PARKED = 20_000
BLOCK = 100
WARMUP = 20
EVERY = "every commit renews (before; older executors)"
LAZY = "renews only when half is left (now)"
NO_FLUSH = "  info, synchronous_commit=off, "

INSERT_RUNS = """
INSERT INTO runs (workspace_id, run_id, agent_id, agent_version, status, wait_reason, wake_at,
                  input, max_steps, max_tokens, max_tool_calls, deadline_seconds, repeat_limit)
SELECT $1, gen_random_uuid(), $2, 1, $3::text, $4::text,
       now() + make_interval(secs => $5 + random() * 3600),
       'bench', 100000, 100000000, 100000, 86400, 3
FROM generate_series(1, $6::int)
"""
# Pending statistics reach pg_stat_user_tables when the backend next goes idle.
FLUSH = "SELECT pg_stat_force_next_flush()"
COUNTERS = """
SELECT n_tup_upd, n_tup_hot_upd, pg_current_wal_insert_lsn() - '0/0'::pg_lsn AS wal
FROM pg_stat_user_tables WHERE relname = 'runs'
"""
INDEXES = """
SELECT string_agg(indexrelname, ', ' ORDER BY indexrelname) FROM pg_stat_user_indexes
WHERE relname = 'runs'
"""


@dataclass
class Series:
    """One way of committing, to its own held runs."""

    renew_always: bool
    runs: list[Run]
    # False: synchronous_commit off, so the statement's own cost shows without the WAL flush.
    durable: bool = True
    seqs: dict[str, int] = field(default_factory=dict)
    samples: list[float] = field(default_factory=list)
    updates: int = 0
    hot: int = 0
    wal_bytes: int = 0
    renewed: int = 0
    _next: itertools.cycle[Run] | None = None

    def next_request(self) -> step_store.CommitRequest:
        if self._next is None:
            self._next = itertools.cycle(self.runs)
        run = next(self._next)
        seq = self.seqs.get(str(run.run_id), 1)
        self.seqs[str(run.run_id)] = seq + 1
        payload = json.dumps({"content": f"step {seq}", "tool_calls": []})
        step = step_store.NewStep(seq, "model_decision", None, payload)
        return step_store.CommitRequest(
            run.workspace_id, run.run_id, run.lease_epoch, [step], renew_always=self.renew_always
        )


async def seed(
    dsn: str,
    workspace: str = WORKSPACE,
    agent: str = AGENT,
    queued: int = 4 * HELD,
    extra: tuple[str, ...] = (),
) -> None:
    """A workspace whose agent has PARKED runs asleep and `queued` runs due (claimed by the
    series), then `extra` statements (bench/fence.py's raw table), then VACUUM ANALYZE."""
    pool = await create_pool(dsn, min_size=1, max_size=1)
    try:
        await workspaces.set_plan(pool, workspace, "enterprise", 1_000_000)
        await agents.create_agent(pool, workspace, agent, agent)
        await agents.publish_version(pool, workspace, agent, {"model": "steps10"})
        async with pool.acquire() as conn:
            await conn.execute(INSERT_RUNS, workspace, agent, "waiting", "sleep", 3600.0, PARKED)
            await conn.execute(INSERT_RUNS, workspace, agent, "queued", None, -3600.0, queued)
            for statement in extra:
                await conn.execute(statement)
            await conn.execute("VACUUM ANALYZE")
    finally:
        await pool.close()


async def counters(pool: asyncpg.pool.Pool) -> tuple[int, int, int]:
    row = await pool.fetchrow(COUNTERS)
    assert row is not None
    return row["n_tup_upd"], row["n_tup_hot_upd"], row["wal"]


async def block(pool: asyncpg.pool.Pool, series: Series, n: int, record: bool) -> None:
    await pool.execute(f"SET synchronous_commit = {'on' if series.durable else 'off'}")
    await pool.execute(FLUSH)
    upd, hot, wal = await counters(pool)
    for _ in range(n):
        req = series.next_request()
        start = time.perf_counter()
        result = await step_store.commit(pool, req, LEASE_SECONDS)
        elapsed = time.perf_counter() - start
        if record:
            series.samples.append(elapsed)
            series.renewed += result.renewed
    await pool.execute(FLUSH)
    upd_after, hot_after, wal_after = await counters(pool)
    if record:
        series.updates += upd_after - upd
        series.hot += hot_after - hot
        series.wal_bytes += int(wal_after - wal)


async def measure(dsn: str, n: int) -> dict[str, Series]:
    await seed(dsn)
    # One connection: the statistics flushed are this backend's, and a lone commit goes
    # out on one pooled connection in the control plane too.
    pool = await create_pool(dsn, min_size=1, max_size=1)
    try:
        held = await claim_due(pool, ["bench-hot"] * (4 * HELD), LEASE_SECONDS)
        assert len(held) == 4 * HELD, f"claimed {len(held)} runs"
        runs = [held[i * HELD : (i + 1) * HELD] for i in range(4)]
        series = {
            EVERY: Series(True, runs[0]),
            LAZY: Series(False, runs[1]),
            NO_FLUSH + EVERY: Series(True, runs[2], durable=False),
            NO_FLUSH + LAZY: Series(False, runs[3], durable=False),
        }
        report.note(f"indexes on runs: {await pool.fetchval(INDEXES)}")
        for s in series.values():
            await block(pool, s, WARMUP, record=False)
        done, order = 0, list(series.values())
        while done < n:
            size = min(BLOCK, n - done)
            for s in order:
                await block(pool, s, size, record=True)
            done += size
            order.reverse()  # no series always first after another
    finally:
        await pool.close()
    return series


def show(series: dict[str, Series]) -> None:
    rows = []
    for label, s in series.items():
        summary = Summary.of(s.samples)
        share = s.hot / s.updates if s.updates else float("nan")
        rows.append(
            [
                label,
                str(summary.n),
                report.ms(summary.p50),
                report.ms(summary.p99),
                str(s.renewed),
                str(s.updates),
                str(s.hot),
                f"{share:.0%}",
                f"{s.wal_bytes / max(1, summary.n):.0f}",
            ]
        )
    report.table(
        [
            "series",
            "n",
            "p50 ms",
            "p99 ms",
            "renewed",
            "n_tup_upd",
            "n_tup_hot_upd",
            "HOT",
            "WAL B/commit",
        ],
        rows,
    )
    for prefix in ("", NO_FLUSH):
        every = Summary.of(series[prefix + EVERY].samples)
        lazy = Summary.of(series[prefix + LAZY].samples)
        report.note(
            f"{prefix.strip(' ,') or 'durable'}: renewing only when needed is p50 "
            f"{lazy.p50 / every.p50:.2f}x, p99 {lazy.p99 / every.p99:.2f}x of renewing "
            "on every commit"
        )
    report.note(
        "a series' runs are renewed again once half the lease is gone: with no heartbeats "
        "here, a run committing for longer than 15 s renews about every 15 s (in service, "
        "heartbeats every 10 s keep more than half left, and commits then never renew)"
    )


async def main(quick: bool = False) -> None:
    n = 300 if quick else 2000
    report.heading(
        f"commit_hot: {n} commits per series, lease {LEASE_SECONDS:.0f} s, "
        f"{HELD} held runs each, {PARKED} parked"
    )
    async with bench_postgres() as pg:
        dsn = await pg.create_database("commit_hot")
        report.note(await durability(dsn))
        series = await measure(dsn, n)
    show(series)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.commit_hot", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    asyncio.run(main(parser.parse_args().quick))
