"""The fenced commit statement in-process against a raw insert and against its own floor.

`python -m bench.fence [--quick] [--no-flush-only]` (issue 49, must-show 3: the fenced
statement in-process <= 1.4x a raw insert). No transport: each series calls one statement
through a pool of one connection (autocommit, as the control plane sends a lone commit),
one model_decision step at a time, round robin over its own held runs:

* **ours**: the store's fenced commit (store.steps.commit: run_commit_keep on a held run
  with more than half its lease left, the common commit), and the same statement bound
  and sent without the store's Python around it;
* **floor**: the least a fenced commit must do, as one statement: lock the run row if it is
  still running under this epoch (FOR SHARE: a claim's update of the epoch waits for it)
  and insert the steps from that row. No counters, no usage, no cost;
* **raw**: one row inserted into a table with no constraint but its primary key;
* between the floor and ours (info): the fence with a commit's lock (FOR NO KEY UPDATE),
  then the run row updated with the step count only, then with ten counters.

And ours on two more databases of the same server, each without one thing the issue
suspected of the statement's cost: the steps -> runs foreign key, and the CHECK
constraints of runs (Postgres builds every one of them for each UPDATE of the row,
whichever columns it sets). Every database is migrated and seeded alike (parked runs, so
the runs indexes have a busy table's size). Every series runs in turns, in blocks, the
order reversed each round, so that the machine's other tenants fall on all of them alike;
first with synchronous_commit off (the statement's own cost, without the WAL flush that
dominates it on a slow disk), then on (the default). Read the ratios: every absolute figure
moves with the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import asyncpg

from bench import commit_hot, report
from bench.commit import RAW_INSERT, RAW_TABLE
from bench.postgres import BenchPostgres, bench_postgres, durability
from bench.stats import Summary, ratio
from control_plane.store import queries
from control_plane.store import steps as step_store
from control_plane.store.db import create_pool
from control_plane.store.lease import claim_due
from control_plane.store.runs import Run

LEASE_SECONDS = 3600.0  # half of it outlasts the measurement: no commit renews
WORKSPACE, AGENT = "fence", "fence"
HELD = 16  # runs each series commits to, round robin
QUEUED = 6 * HELD
PARKED = commit_hot.PARKED  # the seed is commit_hot's
BLOCK = 100
WARMUP = 30
TARGET = 1.4
OURS = "ours: store commit (run_commit_keep)"
FLOOR_SERIES = "floor: fence (FOR SHARE) + insert"
RAW_SERIES = "raw insert (1 row)"
INFO = "  info: "
SQL_ALONE = f"{INFO}run_commit_keep alone (no store Python)"

# The floor: the fence (the run row, still running under this epoch, share-locked so that
# a claim cannot move the epoch under the insert) and the steps inserted from that row.
FLOOR = """
WITH locked AS (
    SELECT workspace_id, run_id, release FROM runs
    WHERE workspace_id = $1 AND run_id = $2 AND lease_epoch = $3 AND status = 'running'
    FOR SHARE
)
INSERT INTO steps (workspace_id, run_id, seq, kind, epoch, ref_seq, payload, created_at, release)
SELECT l.workspace_id, l.run_id, s.seq, s.kind, $3, s.ref_seq, s.payload, now(), l.release
FROM locked l, unnest($4::int[], $5::text[], $6::int[], $7::jsonb[])
    AS s(seq, kind, ref_seq, payload)
"""


# Between the floor and ours, on the "after" database only (where the cost goes): the fence
# taking the lock a commit takes (FOR NO KEY UPDATE), then the run row updated with the step
# count only, then with every counter run_commit_keep adds (but none of the columns it clears).
LOCKED = """
WITH locked AS (
    SELECT workspace_id, run_id, release FROM runs
    WHERE workspace_id = $1 AND run_id = $2 AND lease_epoch = $3 AND status = 'running'
    FOR NO KEY UPDATE
), appended AS (
    INSERT INTO steps (workspace_id, run_id, seq, kind, epoch, ref_seq, payload, created_at,
                       release)
    SELECT l.workspace_id, l.run_id, s.seq, s.kind, $3, s.ref_seq, s.payload, now(), l.release
    FROM locked l, unnest($4::int[], $5::text[], $6::int[], $7::jsonb[])
        AS s(seq, kind, ref_seq, payload)
    RETURNING 1
)
"""
LOCK_INSERT = LOCKED + "SELECT count(*) FROM appended"
COUNT_ONLY = (
    LOCKED
    + """UPDATE runs r SET step_count = r.step_count + cardinality($4::int[]), updated_at = now()
FROM locked WHERE r.workspace_id = $1 AND r.workspace_id = locked.workspace_id
  AND r.run_id = locked.run_id"""
)
COUNTERS = (
    LOCKED
    + """UPDATE runs r SET step_count = r.step_count + cardinality($4::int[]),
    model_calls = r.model_calls + $8, tool_calls = r.tool_calls + $8,
    refused_calls = r.refused_calls + $8, tokens_used = r.tokens_used + $8,
    input_tokens = r.input_tokens + $8, output_tokens = r.output_tokens + $8,
    cached_tokens = r.cached_tokens + $8, reasoning_tokens = r.reasoning_tokens + $8,
    cost_micros = r.cost_micros + $8, updated_at = now()
FROM locked WHERE r.workspace_id = $1 AND r.workspace_id = locked.workspace_id
  AND r.run_id = locked.run_id"""
)


# The two databases each without one part of the statement's cost.
DROP_STEPS_KEY = "ALTER TABLE steps DROP CONSTRAINT steps_workspace_id_run_id_fkey"
DROP_CHECKS = """
DO $$
DECLARE c record;
BEGIN
    FOR c IN SELECT conname FROM pg_constraint
             WHERE conrelid = 'runs'::regclass AND contype = 'c' LOOP
        EXECUTE format('ALTER TABLE runs DROP CONSTRAINT %I', c.conname);
    END LOOP;
END $$
"""


def payload(seq: int) -> str:
    return json.dumps({"content": f"step {seq}", "tool_calls": [], "usage": {}})


@dataclass
class Series:
    label: str
    pool: asyncpg.pool.Pool
    step: Callable[[], Awaitable[None]]
    samples: list[float] = field(default_factory=list)


def ours(pool: asyncpg.pool.Pool, runs: list[Run]) -> Callable[[], Awaitable[None]]:
    cycle, seqs = itertools.cycle(runs), dict.fromkeys([r.run_id for r in runs], 1)

    async def step() -> None:
        run = next(cycle)
        seq = seqs[run.run_id]
        seqs[run.run_id] = seq + 1
        new = step_store.NewStep(seq, "model_decision", None, payload(seq))
        req = step_store.CommitRequest(
            run.workspace_id, run.run_id, run.lease_epoch, [new], renew_always=False
        )
        result = await step_store.commit(pool, req, LEASE_SECONDS)
        assert not result.renewed

    return step


def ours_sql(pool: asyncpg.pool.Pool, runs: list[Run]) -> Callable[[], Awaitable[None]]:
    """run_commit_keep itself, bound as the store binds it, without the store's Python."""
    cycle, seqs = itertools.cycle(runs), dict.fromkeys([r.run_id for r in runs], 1)
    query = queries.load_all()["run_commit_keep"]

    async def step() -> None:
        run = next(cycle)
        seq = seqs[run.run_id]
        seqs[run.run_id] = seq + 1
        new = step_store.NewStep(seq, "model_decision", None, payload(seq))
        req = step_store.CommitRequest(run.workspace_id, run.run_id, run.lease_epoch, [new])
        bound = step_store._bound(req, LEASE_SECONDS, None)
        row = await pool.fetchrow(query.sql, *queries.arguments(query, (), bound))
        assert row is not None

    return step


def statement(
    sql: str, pool: asyncpg.pool.Pool, runs: list[Run], counters: bool = False
) -> Callable[[], Awaitable[None]]:
    cycle, seqs = itertools.cycle(runs), dict.fromkeys([r.run_id for r in runs], 1)

    async def step() -> None:
        run = next(cycle)
        seq = seqs[run.run_id]
        seqs[run.run_id] = seq + 1
        args = [run.workspace_id, run.run_id, run.lease_epoch, [seq], ["model_decision"]]
        args += [[None], [payload(seq)]] + ([1] if counters else [])
        status = await pool.execute(sql, *args)
        assert status in ("INSERT 0 1", "UPDATE 1", "SELECT 1"), status

    return step


def raw(pool: asyncpg.pool.Pool, run_id: object) -> Callable[[], Awaitable[None]]:
    seqs = itertools.count(1)

    async def step() -> None:
        seq = next(seqs)
        await pool.execute(RAW_INSERT, run_id, seq, payload(seq))

    return step


async def seed(dsn: str) -> None:
    await commit_hot.seed(dsn, WORKSPACE, AGENT, QUEUED, extra=(RAW_TABLE,))


async def database(pg: BenchPostgres, name: str, alter: str | None = None) -> str:
    """A migrated database, changed by `alter`, seeded."""
    dsn = await pg.create_database(name)
    if alter is not None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(alter)
        finally:
            await conn.close()
    await seed(dsn)
    return dsn


async def series_for(dsn: str, without: str = "") -> list[Series]:
    """The series on one database: on the schema as it is every one, else ours only."""
    pool = await create_pool(dsn, min_size=1, max_size=1)
    held = await claim_due(pool, ["bench-fence"] * (QUEUED), LEASE_SECONDS)
    assert len(held) == QUEUED, f"claimed {len(held)} runs"
    of = [held[i * HELD : (i + 1) * HELD] for i in range(QUEUED // HELD)]
    if without:
        return [Series(f"{INFO}{OURS}, without {without}", pool, ours(pool, of[0]))]
    return [
        Series(OURS, pool, ours(pool, of[0])),
        Series(FLOOR_SERIES, pool, statement(FLOOR, pool, of[1])),
        Series(RAW_SERIES, pool, raw(pool, uuid.uuid4())),
        Series(SQL_ALONE, pool, ours_sql(pool, of[2])),
        Series(f"{INFO}floor with FOR NO KEY UPDATE", pool, statement(LOCK_INSERT, pool, of[3])),
        Series(f"{INFO} + the run row's step_count", pool, statement(COUNT_ONLY, pool, of[4])),
        Series(f"{INFO} + ten counters", pool, statement(COUNTERS, pool, of[5], True)),
    ]


async def block(series: Series, n: int, durable: bool, record: bool) -> None:
    await series.pool.execute(f"SET synchronous_commit = {'on' if durable else 'off'}")
    for _ in range(n):
        start = time.perf_counter()
        await series.step()
        if record:
            series.samples.append(time.perf_counter() - start)


async def measure(all_series: list[Series], n: int, durable: bool) -> None:
    for s in all_series:
        s.samples.clear()
        await block(s, WARMUP, durable, record=False)
    done, order = 0, list(all_series)
    while done < n:
        size = min(BLOCK, n - done)
        for s in order:
            await block(s, size, durable, record=True)
        done += size
        order.reverse()


def show(all_series: list[Series], durable: bool) -> None:
    mode = "durable" if durable else "no flush"
    report.note(
        "synchronous_commit on (the default)" if durable else "synchronous_commit off (no flush)"
    )
    raw_p50 = Summary.of(next(s for s in all_series if s.label == RAW_SERIES).samples).p50
    report.table(
        ["series", "n", "p50 ms", "p99 ms", "mean ms", "p50 / raw"],
        [
            [
                s.label,
                str(len(s.samples)),
                report.ms(Summary.of(s.samples).p50),
                report.ms(Summary.of(s.samples).p99),
                report.ms(sum(s.samples) / len(s.samples)),
                f"{ratio(Summary.of(s.samples).p50, raw_p50):.2f}x",
            ]
            for s in all_series
        ],
    )
    p50 = {s.label: Summary.of(s.samples).p50 for s in all_series}
    r = ratio(p50[OURS], p50[RAW_SERIES])
    report.target(
        f"{mode}: fenced statement in-process p50 / raw insert", r, f"<= {TARGET:g}x", r <= TARGET
    )
    floor_r = ratio(p50[FLOOR_SERIES], p50[RAW_SERIES])
    report.note(
        f"{mode}: the floor (fence + insert) is {floor_r:.2f}x the raw insert, ours "
        f"{ratio(p50[OURS], p50[FLOOR_SERIES]):.2f}x the floor; the store's Python around the "
        f"statement {report.ms(p50[OURS] - p50[SQL_ALONE])} ms of ours' p50"
    )
    for label in p50:
        if label.startswith(f"{INFO}{OURS}, without"):
            report.note(
                f"{mode}: {label.removeprefix(INFO)}: {ratio(p50[label], p50[OURS]):.2f}x ours"
            )


async def main(quick: bool = False, durable_too: bool = True) -> None:
    n = 300 if quick else 1500
    report.heading(
        f"fence: {n} statements per series, in blocks of {BLOCK}, {HELD} held runs each, "
        f"{PARKED} parked"
    )
    async with bench_postgres() as pg:
        dsn = await database(pg, "fence")
        report.note(await durability(dsn))
        all_series = await series_for(dsn)
        for name, alter, without in (
            ("fence_unkeyed", DROP_STEPS_KEY, "the steps -> runs foreign key"),
            ("fence_unchecked", DROP_CHECKS, "runs' CHECK constraints"),
        ):
            all_series += await series_for(await database(pg, name, alter), without)
        try:
            for durable in (False, True) if durable_too else (False,):
                await measure(all_series, n, durable)
                show(all_series, durable)
        finally:
            for pool in {id(s.pool): s.pool for s in all_series}.values():
                await pool.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.fence", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--no-flush-only", action="store_true", help="skip the durable phase")
    args = parser.parse_args()
    asyncio.run(main(args.quick, not args.no_flush_only))
