"""`agentrun migrate --citus`: refused on plain PostgreSQL before anything runs; on a Citus
cluster (AGENTRUN_TEST_CITUS_URL) it places every table by the plan, from empty and twice."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator

import asyncpg
import pytest

from control_plane.store import citus
from tests.harness import citus as cluster
from tests.harness.databases import create_database, drop_database, new_database_name


@pytest.fixture
async def empty_db_url(pg) -> AsyncIterator[str]:
    name = new_database_name("empty")
    await create_database(pg.url, name)
    yield pg.url_for(name)
    await drop_database(pg.url, name)


async def test_the_plan_places_every_table_of_the_schema(db: asyncpg.Connection) -> None:
    assert await citus.unplanned_tables(db) == []
    tables = {
        r["relname"] for r in await db.fetch("SELECT relname FROM pg_class WHERE relkind='r'")
    }
    assert tables >= citus.PLANNED, "a table in the plan that the migrations do not make"
    placed = citus.REFERENCE_TABLES + citus.COORDINATOR_TABLES + citus.DISTRIBUTED_TABLES
    assert len(placed) == len(citus.PLANNED), "a table placed twice"


async def test_on_plain_postgres_it_refuses_before_migrating_anything(empty_db_url: str) -> None:
    with pytest.raises(citus.CitusError, match="the citus extension is not installed"):
        await citus.migrate_and_distribute(empty_db_url)
    conn = await asyncpg.connect(empty_db_url)
    try:
        assert await conn.fetchval("SELECT to_regclass('schema_migrations')") is None
    finally:
        await conn.close()


def test_the_cli_says_so_and_fails(empty_db_url: str) -> None:
    env = {**os.environ, "DATABASE_URL": empty_db_url}
    done = subprocess.run(
        [sys.executable, "-m", "agentrun_cli", "migrate", "--citus"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "the citus extension is not installed" in done.stderr


@pytest.mark.skipif(cluster.citus_url() is None, reason=cluster.SKIP_REASON)
async def test_on_citus_every_table_is_placed_from_empty_and_twice() -> None:
    url = cluster.citus_url()
    assert url is not None
    fresh = await cluster.fresh_database(url, "migrate")
    try:
        placed = await citus.migrate_and_distribute(fresh, shard_count=4)
        assert sorted(placed) == sorted(citus.REFERENCE_TABLES + citus.DISTRIBUTED_TABLES)
        assert await citus.migrate_and_distribute(fresh) == []
        conn = await asyncpg.connect(fresh)
        try:
            kinds = dict(
                await conn.fetch("SELECT table_name::text, citus_table_type FROM citus_tables")
            )
            colocated = await conn.fetchval(
                "SELECT count(DISTINCT colocation_id) FROM citus_tables"
                " WHERE citus_table_type = 'distributed'"
            )
            keys = await conn.fetchval(
                "SELECT count(*) FROM pg_constraint WHERE contype = 'f'"
                " AND connamespace = 'public'::regnamespace"
            )
        finally:
            await conn.close()
        assert {t: kinds.get(t) for t in citus.DISTRIBUTED_TABLES} == dict.fromkeys(
            citus.DISTRIBUTED_TABLES, "distributed"
        )
        assert {t: kinds.get(t) for t in citus.REFERENCE_TABLES} == dict.fromkeys(
            citus.REFERENCE_TABLES, "reference"
        )
        assert not set(citus.COORDINATOR_TABLES) & set(kinds)
        assert colocated == 1
        assert keys > 20  # the foreign keys between co-located tables are back
    finally:
        await cluster.drop_database(fresh)
