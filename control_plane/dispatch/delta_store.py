"""Model deltas kept in Postgres for the runs' Durable Streams (docs/streams.md).

The hub (control_plane/dispatch/deltas.py) hands every delta an executor streams for a
run it holds to `offer`; they are written in batches, off the commit path, one INSERT per
batch (`stream_deltas_put`: a delta lands once, and only while its epoch holds the run, so
a fenced holder's late deltas land nowhere). A batch waits at most FLUSH_SECONDS; what
cannot be written (the database away) is dropped after a log line: the committed
decision stays the record, as for the watchers.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from agentrun.v1 import run_pb2
from control_plane.store.db import Pool
from control_plane.store.queries import run

log = logging.getLogger(__name__)

FLUSH_SECONDS = 0.05
PENDING_LIMIT = 65_536  # deltas waiting for a write; more are dropped

Row = tuple[str, uuid.UUID, int, int, int, str]


class DeltaStore:
    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._pending: list[Row] = []
        self._wake = asyncio.Event()

    def offer(self, workspace_id: str, run_id: uuid.UUID, delta: run_pb2.RunDelta) -> None:
        if len(self._pending) >= PENDING_LIMIT:
            return
        self._pending.append(
            (workspace_id, run_id, delta.seq, delta.epoch, delta.index, delta.text)
        )
        self._wake.set()

    async def flush(self) -> None:
        batch, self._pending = self._pending, []
        if not batch:
            return
        columns = list(zip(*batch, strict=True))
        try:
            await run(self._pool, "stream_deltas_put", *(list(c) for c in columns))
        except Exception as exc:  # noqa: BLE001 - deltas are best kept, never in the way
            log.warning("dropped %d model deltas: %s", len(batch), exc)

    async def run_forever(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(FLUSH_SECONDS)  # gather a batch
            await self.flush()
