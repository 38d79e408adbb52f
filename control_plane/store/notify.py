"""A replica's own connection for LISTEN/NOTIFY: not from the pool (a pooled connection
must leave no session state behind, control_plane/store/db.py), used for nothing else."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import asyncpg

from control_plane.store.queries import run

# Postgres refuses a NOTIFY payload of 8000 bytes or more.
MAX_PAYLOAD_BYTES = 7999


class Listening:
    """One connection listening on `channel`; `on_payload` hears every payload sent on it
    (this connection's own included), in the order they were committed."""

    def __init__(self, conn: asyncpg.Connection, channel: str) -> None:
        self._conn = conn
        self._channel = channel
        self._lost = asyncio.Event()
        conn.add_termination_listener(lambda _conn: self._lost.set())

    @classmethod
    async def open(cls, dsn: str, channel: str, on_payload: Callable[[str], None]) -> Listening:
        conn = await asyncpg.connect(dsn, command_timeout=10)
        try:
            await conn.add_listener(channel, lambda _c, _pid, _ch, payload: on_payload(payload))
        except BaseException:
            await conn.close(timeout=1)
            raise
        return cls(conn, channel)

    async def send(self, payload: str) -> None:
        """NOTIFY the channel (a statement of its own: heard once it committed)."""
        await run(self._conn, "delta_notify", self._channel, payload)

    async def lost(self) -> None:
        """Returns when the connection is gone (closed, or the server went away)."""
        await self._lost.wait()

    async def close(self) -> None:
        if not self._conn.is_closed():
            await self._conn.close(timeout=1)
