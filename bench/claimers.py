"""What the claim benchmarks (bench/claim.py at the store, bench/claim_dispatch.py delivered)
stand on: bench workspaces with room for every run, runs bulk-loaded with generate_series,
and concurrent claimers, each on its own connection, taking them with the fair claim
(control_plane/store/lease.py `claim_due`) or the raw SKIP LOCKED baseline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import asyncpg

from control_plane.store import agents, workspaces
from control_plane.store.db import create_pool
from control_plane.store.lease import claim_due

LAYOUTS = (1, 100)  # workspaces the queued runs are spread over
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


# The floor: a plain queue table, nothing else on it (no trigger, no count, no fairness), claimed
# the way a hand-rolled queue is, at the same batch by the same claimers (issue 49).
PLAIN_TABLE = """
CREATE TABLE IF NOT EXISTS bench_queue (
    id           bigserial PRIMARY KEY,
    due          timestamptz NOT NULL,
    status       text NOT NULL,
    lease_owner  text,
    lease_until  timestamptz
);
CREATE INDEX IF NOT EXISTS bench_queue_due ON bench_queue (due) WHERE status = 'queued'
"""
PLAIN_LOAD = """
INSERT INTO bench_queue (due, status)
SELECT now() - make_interval(secs => 60 * random()), 'queued' FROM generate_series(1, $1::int)
"""
PLAIN_CLAIM = """
UPDATE bench_queue q SET status = 'running', lease_owner = $1,
    lease_until = now() + make_interval(secs => $3)
WHERE q.id IN (
    SELECT id FROM bench_queue WHERE status = 'queued' AND due <= now()
    ORDER BY due LIMIT $2 FOR UPDATE SKIP LOCKED
)
RETURNING q.id
"""


async def reload_plain(conn: asyncpg.Connection, queued: int) -> None:
    """An empty plain queue, then `queued` due rows, with fresh statistics."""
    await conn.execute(PLAIN_TABLE)
    await conn.execute("TRUNCATE bench_queue")
    await conn.execute(PLAIN_LOAD, queued)
    await conn.execute("VACUUM ANALYZE bench_queue")


async def plain_claim(pool: asyncpg.pool.Pool, owner: str, batch: int) -> int:
    return len(await pool.fetch(PLAIN_CLAIM, owner, batch, float(LEASE_SECONDS)))


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


async def _claimer(
    pool: asyncpg.pool.Pool, claim: Claim, owner: str, batch: int, tally: Tally
) -> None:
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
