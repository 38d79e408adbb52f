"""Events by matching (issue 45): publish -> wake latency, and claim p99 beside 10,000
event waiters.

Two databases on the same server. "sleeps": 10,000 (quick: 2,000) runs parked on sleeps
(wake_at an hour to a day away). "sleeps + events": the same, plus as many runs parked in a
wait_for_event call on `invoice.paid` matched by customer, each with its started step and
its indexed wait row, as the park commit leaves them (control_plane/runs/events.py). Both
are bulk-loaded with generate_series and then VACUUM ANALYZEd.

Claim: rounds alternate between the two databases: insert one due run, time one
single-run claim (control_plane/store/lease.py `claim_due`, as bench/claim.py's depth
figure). Publish: in "sleeps + events", publish one `invoice.paid` event for one customer
through the store's own path (events.publish: the index lookup, the delivery, the wake) and
time it, then claim: the woken run must be the one claimed (exactly its run, nothing
else), and publish -> claimed is the wake latency a dispatcher would see with no poll
delay. A duplicate publish of each tenth event id is timed too and must wake nothing.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg

from bench import report
from bench.claimers import insert_parked, insert_queued, seed
from bench.postgres import BenchPostgres, bench_postgres, durability, foreign_keys_unchecked
from bench.stats import Summary, ratio
from control_plane.runs import events
from control_plane.store.db import create_pool
from control_plane.store.lease import claim_due

WAITERS = 10_000
WARMUP = 20
TARGET = 1.5
NAME = "invoice.paid"

# Runs parked in a wait_for_event call for customer c<g> (bench/claimers.py's runs' columns).
INSERT_WAITING = """
INSERT INTO runs (workspace_id, run_id, agent_id, agent_version, status, wait_reason, wake_at,
                  input, max_steps, max_tokens, max_tool_calls, deadline_seconds, repeat_limit,
                  lease_epoch)
SELECT 'bench0', gen_random_uuid(), 'claim', 1, 'waiting', 'event', NULL,
       '{"customer": "c' || g || '"}', 50, 1000000, 300, 86400, 3, 1
FROM generate_series(1, $1::int) AS g
"""
INSERT_STEPS = """
INSERT INTO steps (workspace_id, run_id, seq, kind, epoch, ref_seq, payload)
SELECT r.workspace_id, r.run_id, s.seq, s.kind, s.epoch, NULL, s.payload
FROM runs r, LATERAL (VALUES
    (0, 'input', 0, jsonb_build_object('text', r.input)),
    (1, 'tool_started', 1, jsonb_build_object(
        'call_id', 'call-1', 'tool', 'wait_for_event',
        'arguments', jsonb_build_object('name', 'invoice.paid',
                                        'match', 'event.customer == run.input.customer')))
) AS s(seq, kind, epoch, payload)
WHERE r.wait_reason = 'event'
"""
INSERT_WAITS = """
INSERT INTO event_waits (workspace_id, run_id, call_seq, slot, event_name, match_key)
SELECT workspace_id, run_id, 1, 0, 'invoice.paid',
       jsonb_build_array(jsonb_build_array('customer', input::jsonb ->> 'customer'))
FROM runs WHERE wait_reason = 'event';
INSERT INTO event_shapes (workspace_id, event_name, shape)
VALUES ('bench0', 'invoice.paid', '["customer"]');
"""


class Database:
    """One bench database and a claimer on it."""

    def __init__(self, label: str, parked: int, waiters: int) -> None:
        self.label = label
        self.parked = parked
        self.waiters = waiters
        self.claims: list[float] = []
        self.dsn = ""
        self.conn: asyncpg.Connection | None = None
        self.pool: asyncpg.pool.Pool | None = None

    async def load(self, pg: BenchPostgres) -> None:
        self.dsn = dsn = await pg.create_database(f"events_{self.waiters}")
        self.conn = await asyncpg.connect(dsn)
        self.pool = await create_pool(dsn, min_size=1, max_size=2)
        await seed(dsn, 1)
        start = time.perf_counter()
        async with foreign_keys_unchecked(self.conn, "runs", "steps", "event_waits"):
            await insert_parked(self.conn, self.parked)
            if self.waiters:
                await self.conn.execute(INSERT_WAITING, self.waiters)
                await self.conn.execute(INSERT_STEPS)
                await self.conn.execute(INSERT_WAITS)
        await self.conn.execute("VACUUM ANALYZE runs")
        await self.conn.execute("VACUUM ANALYZE steps")
        await self.conn.execute("VACUUM ANALYZE event_waits")
        report.note(
            f"{self.label}: loaded {self.parked:,} sleeping and {self.waiters:,} event-waiting "
            f"runs in {time.perf_counter() - start:.1f}s"
        )

    async def claim_one(self, record: bool) -> None:
        assert self.conn is not None and self.pool is not None
        await insert_queued(self.conn, 1)
        start = time.perf_counter()
        rows = await claim_due(self.pool, ["bench-claimer"], 3600)
        elapsed = time.perf_counter() - start
        if len(rows) != 1:
            raise RuntimeError(f"{self.label}: a single claim took {len(rows)} runs")
        if record:
            self.claims.append(elapsed)

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()
        if self.conn is not None:
            await self.conn.close()


def _nothing() -> None:
    return None


def _no_cancel(ws: str, run_id: uuid.UUID) -> None:
    raise RuntimeError("no bench run declares cancel_on")


async def publish_rounds(db: Database, rounds: int) -> tuple[list[float], list[float], list[float]]:
    """(publish, publish -> claimed, duplicate publish) latencies, each event for one
    customer; the claim must take exactly that customer's run."""
    assert db.pool is not None and db.conn is not None
    published, woken, duplicate = [], [], []
    for i in range(WARMUP + rounds):
        customer = f"c{i + 1}"
        wanted = events.Outgoing("bench0", NAME, f"evt-{i}", {"customer": customer}, "bench")
        start = time.perf_counter()
        done = await events.publish(db.pool, wanted, _nothing, _no_cancel)
        after_publish = time.perf_counter()
        rows = await claim_due(db.pool, ["bench-claimer"], 3600)
        claimed = time.perf_counter()
        if done.event.woke != 1 or len(rows) != 1:
            raise RuntimeError(f"event for {customer} woke {done.event.woke}, claimed {len(rows)}")
        got = await db.conn.fetchval(
            "SELECT input FROM runs WHERE workspace_id = 'bench0' AND run_id = $1",
            rows[0].run_id,
        )
        if f'"{customer}"' not in got:
            raise RuntimeError(f"the event for {customer} woke another run: {got}")
        if i >= WARMUP:
            published.append(after_publish - start)
            woken.append(claimed - start)
        if i % 10 == 0:
            start = time.perf_counter()
            again = await events.publish(db.pool, wanted, _nothing, _no_cancel)
            if again.created or await claim_due(db.pool, ["bench-claimer"], 3600):
                raise RuntimeError("a duplicate event id woke a run")
            duplicate.append(time.perf_counter() - start)
    return published, woken, duplicate


async def main(quick: bool = False) -> None:
    waiters = 2_000 if quick else WAITERS
    rounds = 100 if quick else 1000
    async with bench_postgres() as pg:
        plain = Database("sleeps", waiters, 0)
        loaded = Database("sleeps + events", waiters, waiters)
        report.heading(
            f"events: claim p99 with and without {waiters:,} event waiters "
            f"(beside {waiters:,} sleeping runs), and publish -> wake"
        )
        try:
            for db in (plain, loaded):
                await db.load(pg)
            report.note(await durability(plain.dsn))
            for i in range(WARMUP + rounds):
                pair = (plain, loaded) if i % 2 else (loaded, plain)
                for db in pair:
                    await db.claim_one(record=i >= WARMUP)
            published, woken, duplicate = await publish_rounds(loaded, rounds)
        finally:
            await plain.close()
            await loaded.close()
    a, b = Summary.of(plain.claims), Summary.of(loaded.claims)
    report.table(
        report.LATENCY_HEADERS,
        [
            report.latency_row(f"claim, {waiters:,} sleeping", a),
            report.latency_row(f"claim, + {waiters:,} event waiters", b),
            report.latency_row("publish (index lookup, deliver, wake)", Summary.of(published)),
            report.latency_row("publish -> its run claimed", Summary.of(woken)),
            report.latency_row("duplicate publish (wakes nothing)", Summary.of(duplicate)),
        ],
    )
    r = ratio(b.p99, a.p99)
    report.target("claim p99 with/without event waiters", r, f"<= {TARGET:g}x", r <= TARGET)


def run(quick: bool = False) -> None:
    asyncio.run(main(quick))
