"""Migrations apply from empty, exactly once (also under a race), and refuse edited history."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from control_plane.store.migrate import (
    MIGRATION_LOCK_KEY,
    MigrationChecksumError,
    MigrationError,
    MigrationOrderError,
    load_migrations,
    migrate,
    migrations_dir,
)
from tests.harness.databases import create_database, drop_database, new_database_name

LABELS = [m.label for m in load_migrations()]


@pytest.fixture
async def empty_db_url(pg) -> AsyncIterator[str]:
    """A database with nothing in it (not a copy of the migrated template)."""
    name = new_database_name("empty")
    await create_database(pg.url, name)
    yield pg.url_for(name)
    await drop_database(pg.url, name)


@pytest.fixture
def own_migrations(tmp_path: Path) -> Path:
    """A private copy of the repository's migrations, free to edit."""
    directory = tmp_path / "migrations"
    shutil.copytree(migrations_dir(), directory)
    return directory


async def _recorded(url: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetch("SELECT version, name, checksum FROM schema_migrations ORDER BY 1")
    finally:
        await conn.close()


async def _tables(url: str) -> set[str]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    finally:
        await conn.close()
    return {row["tablename"] for row in rows}


async def test_applies_every_migration_from_empty(empty_db_url: str) -> None:
    assert await migrate(empty_db_url) == LABELS

    recorded = await _recorded(empty_db_url)
    assert [f"{r['version']}_{r['name']}" for r in recorded] == LABELS
    assert [r["checksum"] for r in recorded] == [m.checksum for m in load_migrations()]
    assert {"workspaces", "agents", "agent_versions", "runs", "steps"} <= await _tables(
        empty_db_url
    )


async def test_applying_twice_applies_nothing_the_second_time(empty_db_url: str) -> None:
    await migrate(empty_db_url)
    assert await migrate(empty_db_url) == []
    assert len(await _recorded(empty_db_url)) == len(LABELS)


async def test_concurrent_callers_apply_each_migration_once(empty_db_url: str) -> None:
    conns = [await asyncpg.connect(empty_db_url) for _ in range(4)]
    try:
        results = await asyncio.gather(*(migrate(conn) for conn in conns))
    finally:
        await asyncio.gather(*(conn.close() for conn in conns))

    assert sorted(results, key=len) == [[], [], [], LABELS]
    assert len(await _recorded(empty_db_url)) == len(LABELS)


async def test_accepts_a_connection_and_leaves_it_usable(empty_db_url: str) -> None:
    conn = await asyncpg.connect(empty_db_url)
    try:
        assert await migrate(conn) == LABELS
        assert await conn.fetchval("SELECT count(*) FROM runs") == 0
        # The advisory lock is released: another session can take it at once.
        other = await asyncpg.connect(empty_db_url)
        try:
            assert await other.fetchval("SELECT pg_try_advisory_lock($1)", MIGRATION_LOCK_KEY)
        finally:
            await other.close()
    finally:
        await conn.close()


async def test_a_changed_applied_migration_is_refused(
    empty_db_url: str, own_migrations: Path
) -> None:
    await migrate(empty_db_url, own_migrations)
    first = own_migrations / f"{LABELS[0]}.sql"
    first.write_text(first.read_text() + "\nCREATE TABLE sneaky (id int);\n")

    with pytest.raises(MigrationChecksumError, match=first.stem):
        await migrate(empty_db_url, own_migrations)
    assert "sneaky" not in await _tables(empty_db_url)


async def test_a_new_migration_is_applied_alone(empty_db_url: str, own_migrations: Path) -> None:
    await migrate(empty_db_url, own_migrations)
    (own_migrations / "9999_extra.sql").write_text(
        "-- For this test.\nCREATE TABLE extra (id int);\n"
    )

    assert await migrate(empty_db_url, own_migrations) == ["9999_extra"]
    assert "extra" in await _tables(empty_db_url)


async def test_a_failing_migration_leaves_no_trace(empty_db_url: str, own_migrations: Path) -> None:
    await migrate(empty_db_url, own_migrations)
    broken = own_migrations / "9999_broken.sql"
    broken.write_text("-- For this test.\nCREATE TABLE half (id int);\nSELECT 1/0;\n")

    with pytest.raises(MigrationError, match="9999_broken"):
        await migrate(empty_db_url, own_migrations)
    assert "half" not in await _tables(empty_db_url)
    assert len(await _recorded(empty_db_url)) == len(LABELS)

    broken.write_text("-- For this test, fixed.\nCREATE TABLE half (id int);\n")
    assert await migrate(empty_db_url, own_migrations) == ["9999_broken"]


async def test_a_migration_numbered_below_an_applied_one_is_refused(
    empty_db_url: str, own_migrations: Path
) -> None:
    await migrate(empty_db_url, own_migrations)
    (own_migrations / "0000_forgotten.sql").write_text(
        "-- For this test.\nCREATE TABLE f (id int);\n"
    )

    with pytest.raises(MigrationOrderError, match="0000_forgotten"):
        await migrate(empty_db_url, own_migrations)
    assert "f" not in await _tables(empty_db_url)


async def test_renumbered_files_are_recognised_not_applied_again(
    empty_db_url: str, own_migrations: Path
) -> None:
    await migrate(empty_db_url, own_migrations)
    before = {(r["name"], r["checksum"]) for r in await _recorded(empty_db_url)}
    labels = _renumber(own_migrations, by=100)

    assert await migrate(empty_db_url, own_migrations) == []
    after = await _recorded(empty_db_url)
    assert {(r["name"], r["checksum"]) for r in after} == before
    assert [f"{r['version']}_{r['name']}" for r in after] == labels


def _renumber(directory: Path, by: int) -> list[str]:
    """Move every file's number up by `by`, keeping names and bytes; the new labels."""
    for path in sorted(directory.glob("*.sql"), reverse=True):
        version, rest = path.name.split("_", 1)
        path.rename(directory / f"{int(version) + by:04d}_{rest}")
    return sorted(p.stem for p in directory.glob("*.sql"))


def test_migration_numbers_follow_each_other_from_0001() -> None:
    versions = [int(m.version) for m in load_migrations()]
    assert versions == list(range(1, len(versions) + 1))


def test_badly_named_files_are_refused(own_migrations: Path) -> None:
    (own_migrations / "2_oops.sql").write_text("SELECT 1;\n")
    with pytest.raises(MigrationError, match="NNNN_name.sql"):
        load_migrations(own_migrations)


def test_every_migration_opens_with_a_comment_saying_why() -> None:
    for migration in load_migrations():
        assert migration.sql.startswith("-- "), f"{migration.label} must open with a comment"


async def test_the_template_database_is_migrated(db: asyncpg.Connection) -> None:
    versions = await db.fetch("SELECT version, name FROM schema_migrations ORDER BY 1")
    assert [f"{r['version']}_{r['name']}" for r in versions] == LABELS
