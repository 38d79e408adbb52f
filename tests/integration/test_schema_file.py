"""schema.sql builds the database the migrations build (procrastinate keeps the same pair).

Two databases, one migrated and one built from control_plane/store/sql/schema.sql, are
described object by object from the catalog (columns in order, defaults, constraints,
indexes, functions, triggers, sequences, views, types, comments, and the rows a build
inserts) and the descriptions must be equal; a difference is shown as a unified diff.
Function bodies are compared as written, comments and all: they are what the database
keeps. Both walks of the claim are checked (see agentrun_claim_shard in schema.sql).
"""

from __future__ import annotations

import difflib
from pathlib import Path

import asyncpg
import pytest

from agentrun_cli.devstack import EmbeddedPostgres
from control_plane.store import queries
from control_plane.store.migrate import migrate
from control_plane.store.queries import SCHEMA_FILE
from tests.harness.databases import (
    create_database,
    drop_database,
    new_database_name,
    run_schema_file,
)
from tests.harness.servers import ExternalPostgres

Postgres = EmbeddedPostgres | ExternalPostgres

# The migrator's own bookkeeping, which schema.sql does not build.
BOOKKEEPING = "schema_migrations"
WALKS = ("default", "levels")

# Each query yields (object, definition) pairs of the public schema; `$1` is BOOKKEEPING.
_CATALOG = {
    "relation": """
        SELECT c.relname, concat_ws(' ', c.relkind::text, c.relpersistence::text,
                                    c.reloptions::text, 'rls=' || c.relrowsecurity::text,
                                    'replident=' || c.relreplident::text)
        FROM pg_class c
        WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
          AND c.relname <> $1""",
    "column": """
        SELECT c.relname || '.' || lpad(row_number() OVER w::text, 3, '0') || ' ' || a.attname,
               concat_ws(' ', format_type(a.atttypid, a.atttypmod),
                         CASE WHEN a.attnotnull THEN 'NOT NULL' END,
                         'DEFAULT ' || pg_get_expr(d.adbin, d.adrelid),
                         'IDENTITY ' || nullif(a.attidentity::text, ''),
                         'GENERATED ' || nullif(a.attgenerated::text, ''),
                         'COLLATE ' || nullif(a.attcollation, t.typcollation)::regcollation::text)
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_type t ON t.oid = a.atttypid
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
          AND c.relname <> $1 AND a.attnum > 0 AND NOT a.attisdropped
        WINDOW w AS (PARTITION BY c.oid ORDER BY a.attnum)""",
    "constraint": """
        SELECT coalesce(c.relname, t.typname) || '.' || k.conname,
               pg_get_constraintdef(k.oid)
        FROM pg_constraint k
        LEFT JOIN pg_class c ON c.oid = k.conrelid
        LEFT JOIN pg_type t ON t.oid = k.contypid
        WHERE k.connamespace = 'public'::regnamespace AND c.relname IS DISTINCT FROM $1""",
    "index": """
        SELECT indexname, indexdef FROM pg_indexes
        WHERE schemaname = 'public' AND tablename <> $1""",
    "function": """
        SELECT p.proname || CASE WHEN count(*) OVER (PARTITION BY p.proname) > 1
                                 THEN '(' || oidvectortypes(p.proargtypes) || ')' ELSE '' END,
               CASE WHEN p.prokind IN ('a', 'w') THEN p.prokind::text
                    ELSE pg_get_functiondef(p.oid) END
        FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace""",
    "trigger": """
        SELECT c.relname || '.' || g.tgname, pg_get_triggerdef(g.oid) || ' ' || g.tgenabled::text
        FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid
        WHERE c.relnamespace = 'public'::regnamespace AND NOT g.tgisinternal""",
    "sequence": """
        SELECT s.sequencename,
               concat_ws(' ', s.data_type::text, s.start_value, s.min_value, s.max_value,
                         s.increment_by, s.cycle, s.cache_size, 'owned by ' || (
                   SELECT d.refobjid::regclass::text || '.' || a.attname FROM pg_depend d
                   JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                   WHERE d.classid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')
                     AND d.objid = (quote_ident(s.schemaname) || '.'
                                    || quote_ident(s.sequencename))::regclass))
        FROM pg_sequences s WHERE s.schemaname = 'public'""",
    "view": """
        SELECT c.relname, pg_get_viewdef(c.oid) FROM pg_class c
        WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('v', 'm')""",
    "type": """
        SELECT t.typname, concat_ws(' ', t.typtype::text, format_type(nullif(t.typbasetype, 0), NULL),
                                    (SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
                                     FROM pg_enum e WHERE e.enumtypid = t.oid))
        FROM pg_type t
        LEFT JOIN pg_class c ON c.oid = t.typrelid
        WHERE t.typnamespace = 'public'::regnamespace AND t.typtype IN ('e', 'd', 'r', 'm', 'c')
          AND (c.oid IS NULL OR c.relkind = 'c')""",
    "policy": """
        SELECT tablename || '.' || policyname,
               concat_ws(' ', permissive, roles::text, cmd, qual, with_check)
        FROM pg_policies WHERE schemaname = 'public'""",
    # Comments on anything created after initdb (oids from 16384 on).
    "comment": """
        SELECT pg_describe_object(classoid, objoid, objsubid), description
        FROM pg_description WHERE objoid >= 16384""",
    "extension": "SELECT extname, extversion FROM pg_extension",
}


async def describe(conn: asyncpg.Connection) -> dict[str, str]:
    """Every object of the public schema, as 'kind name' -> its definition, and the rows of
    every table that has any (a build seeds a few, as plans)."""
    found: dict[str, str] = {}
    for kind, query in _CATALOG.items():
        args = (BOOKKEEPING,) if "$1" in query else ()
        for name, definition in await conn.fetch(query, *args):
            found[f"{kind} {name}"] = definition
    tables = await conn.fetch(
        "SELECT quote_ident(relname) AS t FROM pg_class"
        " WHERE relnamespace = 'public'::regnamespace AND relkind = 'r' AND relname <> $1",
        BOOKKEEPING,
    )
    for table in (row["t"] for row in tables):
        rows = await conn.fetch(f"SELECT r::text AS r FROM {table} r ORDER BY 1")
        if rows:
            found[f"rows {table}"] = "\n".join(row["r"] for row in rows)
    return found


def differences(migrated: dict[str, str], built: dict[str, str]) -> str:
    """A unified diff from the migrated database to the built one ('' when they are equal):
    one line per line of each definition, each prefixed by its object."""

    def lines(described: dict[str, str]) -> list[str]:
        return [
            f"{name}: {line}"
            for name in sorted(described)
            for line in described[name].splitlines() or [""]
        ]

    diff = difflib.unified_diff(
        lines(migrated), lines(built), "migrations", "schema.sql", n=2, lineterm=""
    )
    return "\n".join(diff)


async def built(pg: Postgres, walk: str, schema_file: Path | None = None) -> dict[str, str]:
    """The description of a fresh database built by the migrations, or by `schema_file`,
    with the claim's walk as `walk` asks ('levels', or the server's choice); the database
    is dropped afterwards."""
    name = new_database_name("schema_file")
    await create_database(pg.url, name)
    try:
        conn = await asyncpg.connect(pg.url_for(name))
        try:
            # The session setting both builds read to pick the claim's walk.
            await conn.execute("SELECT set_config('agentrun.claim_walk', $1, false)", walk)
            if schema_file is None:
                await migrate(conn)
            else:
                await run_schema_file(conn, schema_file)
            return await describe(conn)
        finally:
            await conn.close()
    finally:
        await drop_database(pg.url, name)


@pytest.fixture(scope="module")
async def migrated(pg: Postgres) -> dict[str, dict[str, str]]:
    """The migrated database's description, for each walk of the claim."""
    return {walk: await built(pg, walk) for walk in WALKS}


@pytest.mark.parametrize("walk", WALKS)
async def test_schema_file_builds_the_database_the_migrations_build(
    pg: Postgres, migrated: dict[str, dict[str, str]], walk: str
) -> None:
    diff = differences(migrated[walk], await built(pg, walk, SCHEMA_FILE))
    assert not diff, (
        "schema.sql no longer builds what the migrations build; a migration carries the "
        "change and schema.sql is updated in the same commit (migrations/README.md):\n" + diff
    )


def planted(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"the drift test expects {old!r} once in schema.sql"
    return text.replace(old, new)


async def test_a_drift_between_the_two_is_reported(
    pg: Postgres, migrated: dict[str, dict[str, str]], tmp_path: Path
) -> None:
    """One CHECK and one function body changed in a copy of schema.sql: the comparison
    names both, with the lines that differ."""
    text = SCHEMA_FILE.read_text()
    text = planted(
        text,
        "CONSTRAINT run_output_or_error CHECK (output IS NULL OR error IS NULL)",
        "CONSTRAINT run_output_or_error CHECK (output IS NULL OR error IS NOT NULL)",
    )
    text = planted(text, "NEW.held_since := NULL;", "NEW.held_since := now();")
    drifted = tmp_path / "schema.sql"
    drifted.write_text(text)

    diff = differences(migrated["default"], await built(pg, "default", drifted))

    changed = {line for line in diff.splitlines()[2:] if line[:1] in "+-"}
    assert changed == {
        "-constraint runs.run_output_or_error: CHECK (((output IS NULL) OR (error IS NULL)))",
        "+constraint runs.run_output_or_error: CHECK (((output IS NULL) OR (error IS NOT NULL)))",
        "-function runs_count_active_time:     NEW.held_since := NULL;",
        "+function runs_count_active_time:     NEW.held_since := now();",
    }, diff


def test_the_schema_file_holds_no_named_queries() -> None:
    """The query loader skips schema.sql: nothing at run time reads it."""
    assert "-- name:" not in SCHEMA_FILE.read_text()
    assert all(q.source != SCHEMA_FILE.name for q in queries.QUERIES.values())
    assert queries.load_all() == queries.QUERIES
