"""The asyncpg pool (jsonb as text: payloads pass through untouched; UUIDs native), and the
names the rest of the control plane uses for it: only the store imports asyncpg."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypeAlias

import asyncpg

# What callers outside the store name a pool, a connection (inside a transaction) or a row by.
Pool: TypeAlias = asyncpg.pool.Pool
Connection: TypeAlias = asyncpg.Connection
Record: TypeAlias = asyncpg.Record
# A connection taken from a pool and held by its taker between statements (the commit
# groups' lanes: dispatch/commits.py).
Lane: TypeAlias = asyncpg.pool.PoolConnectionProxy


async def _no_reset(conn: Connection) -> None:
    return None


async def connect(dsn: str) -> Connection:
    """One connection, for short administrative jobs (bootstrap, key minting)."""
    return await asyncpg.connect(dsn)


async def create_pool(dsn: str, *, min_size: int = 2, max_size: int = 20) -> Pool:
    """A pool whose connections survive a Postgres restart by reconnecting lazily."""
    pool = await asyncpg.create_pool(
        dsn,
        # Nothing here leaves session state behind (no SET, LISTEN, cursors or
        # session advisory locks), so the default per-release reset query is
        # pure overhead on every commit.
        reset=_no_reset,
        min_size=min_size,
        max_size=max_size,
        max_inactive_connection_lifetime=60,
        command_timeout=30,
    )
    assert pool is not None
    return pool


@asynccontextmanager
async def transaction(db: Pool | Connection) -> AsyncIterator[Connection]:
    """A connection inside a transaction: committed on exit, rolled back on an exception.

    Given a connection (the caller's transaction), a savepoint inside it: an error here
    (a unique violation the caller handles) does not doom the caller's transaction.
    """
    if isinstance(db, asyncpg.Connection):
        async with db.transaction():
            yield db
        return
    async with db.acquire() as conn, conn.transaction():
        yield conn


def in_transaction(db: Pool | Connection) -> bool:
    """Whether `db` is a caller's connection (its transaction) rather than the pool."""
    return isinstance(db, asyncpg.Connection)
