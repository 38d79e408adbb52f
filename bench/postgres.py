"""The benchmarks' Postgres: an embedded durable server (or DATABASE_URL) with fresh databases.

Durable settings (fsync on) so that a step commit is compared with a raw insert that pays
the same WAL flush. With DATABASE_URL set, the databases are created on that server and
dropped at the end; otherwise the embedded server and its data directory go away.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from agentrun_cli.devstack import EmbeddedPostgres
from control_plane.store.migrate import migrate_url


def with_database(dsn: str, dbname: str) -> str:
    """The same DSN pointing at another database."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{dbname}"))


class BenchPostgres:
    """One server; `create_database` hands out empty (or migrated) databases on it."""

    def __init__(self, admin_dsn: str, server_pid: int | None = None) -> None:
        self.admin_dsn = admin_dsn
        self.server_pid = server_pid  # the postmaster, when it is ours (for its CPU)
        self.created: list[str] = []

    async def create_database(self, name: str, *, migrated: bool = True) -> str:
        """A fresh database named for the benchmark; migrated unless asked otherwise."""
        dbname = f"bench_{name}_{os.getpid()}"
        conn = await asyncpg.connect(self.admin_dsn)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
            await conn.execute(f'CREATE DATABASE "{dbname}"')
        finally:
            await conn.close()
        self.created.append(dbname)
        dsn = with_database(self.admin_dsn, dbname)
        if migrated:
            await migrate_url(dsn)
        return dsn

    async def drop_created(self) -> None:
        conn = await asyncpg.connect(self.admin_dsn)
        try:
            for dbname in self.created:
                await conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        finally:
            await conn.close()


async def durability(dsn: str) -> str:
    """The server's WAL durability settings, for the report."""
    conn = await asyncpg.connect(dsn)
    try:
        names = ("fsync", "synchronous_commit", "wal_sync_method", "shared_buffers")
        values = [await conn.fetchval(f"SHOW {name}") for name in names]
        version = await conn.fetchval("SHOW server_version")
    finally:
        await conn.close()
    settings = " ".join(f"{n}={v}" for n, v in zip(names, values, strict=True))
    return f"Postgres {version}: {settings}"


@asynccontextmanager
async def bench_postgres() -> AsyncIterator[BenchPostgres]:
    """DATABASE_URL's server if set, else an embedded one (fsync on) for this benchmark only."""
    url = os.environ.get("DATABASE_URL")
    if url:
        pg = BenchPostgres(url)
        try:
            yield pg
        finally:
            await pg.drop_created()
        return
    tmp = Path(tempfile.mkdtemp(prefix="agentrun-bench-pg-"))
    server = EmbeddedPostgres(tmp / "data", fast=False)
    try:
        # Blocking on purpose: stopping must not depend on the loop's thread pool still working.
        server.start()
        yield BenchPostgres(server.url, server.pid)
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@asynccontextmanager
async def foreign_keys_unchecked(conn: asyncpg.Connection, *tables: str) -> AsyncIterator[bool]:
    """Bulk loads without the per-row foreign-key checks on `tables`; every other trigger
    (the fairness bookkeeping among them) still fires. The bench data references rows it
    seeded, so the check only costs time (about a third of a million-run load here).
    Needs a superuser (the embedded server's); otherwise the checks stay on. Yields whether
    they were off."""
    async with AsyncExitStack() as stack:
        try:
            for table in tables:
                # ALL includes the internal constraint triggers; USER turns the rest back on.
                await conn.execute(f"ALTER TABLE {table} DISABLE TRIGGER ALL")
                stack.push_async_callback(conn.execute, f"ALTER TABLE {table} ENABLE TRIGGER ALL")
                await conn.execute(f"ALTER TABLE {table} ENABLE TRIGGER USER")
        except asyncpg.InsufficientPrivilegeError:
            yield False
            return
        yield True
