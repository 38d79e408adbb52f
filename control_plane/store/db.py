"""The asyncpg pool: jsonb as text (payloads pass through untouched), UUIDs native."""

from __future__ import annotations

import asyncpg


async def _no_reset(conn: asyncpg.Connection) -> None:
    return None


async def connect(dsn: str) -> asyncpg.Connection:
    """One connection, for short administrative jobs (bootstrap, key minting)."""
    return await asyncpg.connect(dsn)


async def create_pool(dsn: str, *, min_size: int = 2, max_size: int = 20) -> asyncpg.pool.Pool:
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
