"""The two ways the claim reads an agent's due runs (migrations/0034_claim_skip_scan.sql):
Postgres 18's skip scan, and the walk one priority level at a time that servers before 18
keep. The migration picks by the server's version; both must claim the same runs in the
same order, whatever the priorities, parked runs, caps, releases and tools."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from control_plane.store import lease, workspaces
from tests import factories
from tests.harness.databases import use_claim_walk

SKIP_SCAN = "ORDER BY r.priority DESC, r.wake_at, r.run_id"
LEVELS = "WITH RECURSIVE levels"
AT = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


async def definition(conn: asyncpg.Connection) -> str:
    return await conn.fetchval("SELECT pg_get_functiondef('agentrun_claim_shard'::regproc)")


async def test_the_server_version_picks_the_walk(db: asyncpg.Connection) -> None:
    version = int(await db.fetchval("SHOW server_version_num"))
    migrated = await definition(db)
    if version >= 180000:
        assert SKIP_SCAN in migrated and LEVELS not in migrated
    else:
        assert LEVELS in migrated and SKIP_SCAN not in migrated
    await use_claim_walk(db, "levels")
    assert LEVELS in await definition(db) and SKIP_SCAN not in await definition(db)
    await use_claim_walk(db, "default")
    assert await definition(db) == migrated
    # The setting lasted only as long as the migration's transaction.
    assert not await db.fetchval("SELECT current_setting('agentrun.claim_walk', true)")


LOAD = """
INSERT INTO runs (workspace_id, run_id, agent_id, agent_version, status, wait_reason, wake_at,
                  input, max_steps, max_tokens, max_tool_calls, deadline_seconds, repeat_limit,
                  priority, release, created_at)
SELECT * FROM unnest($1::text[], $2::uuid[], $3::text[], $4::int[], $5::text[], $6::text[],
                     $7::timestamptz[], $8::text[], $9::int[], $10::int[], $11::int[],
                     $12::int[], $13::int[], $14::int[], $15::text[], $16::timestamptz[])
"""


def layout(seed: int) -> list[tuple]:
    """Runs over four workspaces of two agents each: priorities from -2 to 5, due, parked
    until later or with no wake time at all (often at a higher priority than the due
    ones), on release r1, r2 or none."""
    rng = random.Random(seed)
    rows = []
    for w in range(4):
        for a in ("plain", "tooled"):
            for i in range(rng.randrange(6, 16)):
                state = rng.choice(["due", "due", "due", "later", "none"])
                wake = {
                    "due": AT - timedelta(seconds=rng.randrange(1, 600)),
                    "later": AT + timedelta(hours=1, seconds=i),
                    "none": None,
                }[state]
                status = "queued" if state == "due" and rng.random() < 0.7 else "waiting"
                rows.append(
                    (
                        f"w{w}",
                        uuid.UUID(int=rng.getrandbits(128)),
                        a,
                        0,
                        status,
                        None if status == "queued" else "sleep",
                        wake,
                        f"input {i}",
                        50,
                        1000,
                        30,
                        3600,
                        3,
                        rng.choice([-2, 0, 0, 0, 1, 5]),
                        rng.choice([None, None, "r1", "r2"]),
                        AT - timedelta(minutes=30),
                    )
                )
    return rows


async def load(pool: asyncpg.pool.Pool, rows: list[tuple]) -> None:
    versions = {}
    for w, cap in (("w0", 100), ("w1", 3), ("w2", 100), ("w3", 5)):
        await workspaces.set_plan(pool, w, "enterprise", cap)
        versions[w, "plain"] = await factories.agent_version(
            pool, w, "plain", {**factories.DEFAULT_SPEC, "tools": ["echo"]}
        )
        versions[w, "tooled"] = await factories.agent_version(pool, w, "tooled")
    await pool.execute("UPDATE agents SET max_concurrency = 2 WHERE workspace_id = 'w2'")
    rows = [(*r[:3], versions[r[0], r[2]], *r[4:]) for r in rows]
    await pool.execute(LOAD, *[list(col) for col in zip(*rows, strict=True)])
    await pool.execute("UPDATE workspace_turns SET next_wake_at = $1, last_served_at = $1", AT)


# The claims each side makes, in turn: owners, and what the owners carry or continue.
KINDS = [
    {"owners": 1},
    {"owners": 4},
    {"owners": 3, "carried": ["echo"]},  # only the plain agents' runs
    {"owners": 5, "release": lease.Release("r1", continues=("r2",))},  # no new runs
    {"owners": 64},
]


async def claims(pool: asyncpg.pool.Pool) -> list[tuple[int, list[tuple[str, uuid.UUID]]]]:
    """40 claims of those kinds in turn, on the fixed clock: (owners, the runs leased)."""
    out = []
    for turn in range(40):
        kind = KINDS[turn % len(KINDS)]
        got = await lease.claim_due(
            pool,
            ["ex"] * kind["owners"],
            3600,
            now=AT + timedelta(milliseconds=turn),
            carried=kind.get("carried"),
            release=kind.get("release"),
        )
        out.append((kind["owners"], [(r.workspace_id, r.run_id) for r in got]))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_both_walks_claim_the_same_runs_in_the_same_order(
    db_url: str, spare_databases, pg, seed: int
) -> None:
    rows = layout(seed)
    other = await spare_databases.take()
    seen = {}
    try:
        for walk, url in (("default", db_url), ("levels", pg.url_for(other))):
            pool = await asyncpg.create_pool(url, min_size=1, max_size=2)
            try:
                async with pool.acquire() as conn:
                    await use_claim_walk(conn, walk)
                await load(pool, rows)
                seen[walk] = await claims(pool)
            finally:
                await pool.close()
    finally:
        spare_databases.drop(other)
    assert seen["default"] == seen["levels"]
    claimed = [run for _, got in seen["levels"] for run in got]
    assert len(claimed) == len(set(claimed)) > 10  # each run leased once, for an hour
    # The caps, releases and tools decided something: claims came back with some runs,
    # fewer than their owners.
    assert any(0 < len(got) < owners for owners, got in seen["levels"])
