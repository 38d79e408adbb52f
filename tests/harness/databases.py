"""Test databases: one migrated template per session, one copy of it per test."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import uuid
from collections.abc import Sequence
from pathlib import Path

import asyncpg

from control_plane.store.citus import CLAIM_SETTINGS, has_citus, migrate_and_distribute
from control_plane.store.migrate import migrate, migrations_dir
from control_plane.store.queries import SCHEMA_FILE

# AGENTRUN_TEST_TEMPLATE_DB names it otherwise, for two sessions sharing a DATABASE_URL server.
TEMPLATE_DB = os.environ.get("AGENTRUN_TEST_TEMPLATE_DB") or "agentrun_template"


# The migration that picks how the claim reads each agent's due runs (a skip scan on
# Postgres 18 and later, a walk over priority levels before).
# The last migration that (re)creates the claim function; use_claim_walk runs its DO block.
CLAIM_WALK_MIGRATION = "0052_claim_none_locked.sql"


async def use_claim_walk(conn: asyncpg.Connection, walk: str) -> None:
    """Replace the claim function as CLAIM_WALK_MIGRATION's DO block makes it: with the walk
    over priority levels forced ('levels'), or as the server's version picks ('default').
    On a Citus coordinator the settings `migrate --citus` gives it are put back."""
    text = (migrations_dir() / CLAIM_WALK_MIGRATION).read_text()
    begin = text.index("DO $claim_walk$")
    sql = text[begin : text.index("$claim_walk$;", begin + 1) + len("$claim_walk$;")]
    async with conn.transaction():
        value = "levels" if walk == "levels" else ""
        await conn.execute("SELECT set_config('agentrun.claim_walk', $1, true)", value)
        await conn.execute(sql)
        if await has_citus(conn):
            for statement in CLAIM_SETTINGS:
                await conn.execute(statement)


async def run_schema_file(conn: asyncpg.Connection, path: Path = SCHEMA_FILE) -> None:
    """Build the schema in conn's empty database from a schema file, in one transaction."""
    sql = await asyncio.to_thread(path.read_text)
    async with conn.transaction():
        await conn.execute(sql)


def new_database_name(prefix: str = "test") -> str:
    """A fresh database name, unique across concurrent test sessions."""
    return f"{prefix}_{uuid.uuid4().hex}"


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


async def _execute(url: str, sql: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def create_database(
    admin_url: str, name: str, template: str | None = None, workers: Sequence[str] = ()
) -> None:
    """CREATE DATABASE name [TEMPLATE template], through a connection to admin_url (and,
    on a Citus cluster, to each worker: a copy of a distributed template is one on every
    node, shards included, with the same metadata)."""
    sql = f"CREATE DATABASE {_quoted(name)}"
    if template is not None:
        sql += f" TEMPLATE {_quoted(template)}"
    for url in (*workers, admin_url):
        await _execute(url, sql)


async def drop_database(admin_url: str, name: str, workers: Sequence[str] = ()) -> None:
    """DROP DATABASE IF EXISTS name WITH (FORCE): connections left open are terminated."""
    for url in (admin_url, *workers):
        await _execute(url, f"DROP DATABASE IF EXISTS {_quoted(name)} WITH (FORCE)")


async def create_template(
    admin_url: str, template_url: str, workers: Sequence[str] = ()
) -> list[str]:
    """(Re)create TEMPLATE_DB and migrate it; return the migrations applied (on Citus,
    the tables placed).

    migrate() closes its connection, as it must: PostgreSQL refuses to copy a template that
    anyone is connected to. On a Citus cluster the template is made on every node,
    migrated and distributed (`agentrun migrate --citus`), then closed to connections:
    Citus's maintenance daemon would otherwise hold it open.
    """
    await drop_database(admin_url, TEMPLATE_DB, workers)
    if not workers:
        await create_database(admin_url, TEMPLATE_DB)
        return await migrate(template_url)
    from tests.harness import citus

    await citus.create_cluster_database(admin_url, workers, TEMPLATE_DB)
    applied = await migrate_and_distribute(template_url, citus.TEST_SHARD_COUNT)
    await citus.close_to_connections(admin_url, workers, TEMPLATE_DB)
    return applied


async def _copied(admin_url: str, name: str, template: str, workers: Sequence[str]) -> str:
    await create_database(admin_url, name, template=template, workers=workers)
    return name


class SpareDatabases:
    """Fresh copies of the template, each made while the test before runs.

    `take()` hands out the copy made in the background (on a thread of its own, so it
    goes on during synchronous tests too) and starts the next; a copy that failed (a test
    stopped the server under it) is made again there and then. Every test still gets a
    database of its own that nobody else touched: only the moment it was copied moved.
    """

    def __init__(self, admin_url: str, template: str, workers: Sequence[str] = ()) -> None:
        self.admin_url = admin_url
        self.template = template
        self.workers = tuple(workers)
        self._thread = concurrent.futures.ThreadPoolExecutor(1, "spare-database")
        self._next: concurrent.futures.Future[str] | None = None
        self._drops: list[tuple[str, concurrent.futures.Future[None]]] = []

    def _copy(self) -> concurrent.futures.Future[str]:
        copy = _copied(self.admin_url, new_database_name(), self.template, self.workers)
        return self._thread.submit(asyncio.run, copy)

    async def take(self) -> str:
        """A fresh copy of the template; the next one is started before this returns."""
        spare, self._next = self._next, None
        name = None
        if spare is not None:
            with contextlib.suppress(Exception):  # made again below, where errors do show
                name = await asyncio.wrap_future(spare)
        if name is None:
            name = await _copied(self.admin_url, new_database_name(), self.template, self.workers)
        self._next = self._copy()
        return name

    def drop(self, name: str) -> None:
        """Drop a test's database in the background (while the next test runs)."""
        drop = self._thread.submit(asyncio.run, drop_database(self.admin_url, name, self.workers))
        self._drops.append((name, drop))

    def close(self) -> None:
        """Drop the copy no test took; a background drop that failed is tried again here."""
        spare, self._next = self._next, None
        if spare is not None:
            with contextlib.suppress(Exception):
                self.drop(spare.result())
        for name, drop in self._drops:
            if drop.exception() is not None:
                self._thread.submit(
                    asyncio.run, drop_database(self.admin_url, name, self.workers)
                ).result()
        self._thread.shutdown()
