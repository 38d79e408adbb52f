"""Model deltas kept in Postgres for the runs' Durable Streams (docs/streams.md), and the
sweep of what the streams keep that nobody reads any more.

The hub (control_plane/dispatch/deltas.py) hands every delta an executor streams for a
run it holds to `offer`; they are written in batches, off the commit path, one INSERT per
workspace of a batch (`stream_deltas_put`: a delta lands once, and only while its epoch
holds the run, so a fenced holder's late deltas land nowhere; one workspace, so that on
Citus it is one shard). A batch waits at most FLUSH_SECONDS; what
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
# The sweep: what the streams keep that nobody reads any more.
SWEEP_SECONDS = 60.0
COMPACTED_AFTER_SECONDS = 60  # a reader inside a call's deltas has this long to read them
FEED_DAYS = 30  # the workspace feed's events are kept this many days
SWEEP_BATCH = 10_000

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
        by_workspace: dict[str, list[Row]] = {}
        for row in batch:
            by_workspace.setdefault(row[0], []).append(row)
        for workspace_id, rows in by_workspace.items():
            columns = list(zip(*(row[1:] for row in rows), strict=True))
            try:
                await run(
                    self._pool, "stream_deltas_put", workspace_id, *(list(c) for c in columns)
                )
            except Exception as exc:  # noqa: BLE001 - deltas are best kept, never in the way
                log.warning("dropped %d model deltas: %s", len(rows), exc)

    async def run_forever(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(FLUSH_SECONDS)  # gather a batch
            await self.flush()


async def sweep(pool: Pool) -> None:
    """Delete, a batch of each: deltas of committed decisions (COMPACTED_AFTER_SECONDS
    after they were written), feed events older than FEED_DAYS, and expired workspace
    streams that no fork involves (the others expire when next touched)."""
    await run(pool, "stream_sweep_deltas", COMPACTED_AFTER_SECONDS, SWEEP_BATCH)
    await run(pool, "stream_sweep_feed", FEED_DAYS, SWEEP_BATCH)
    await run(pool, "stream_sweep_expired", SWEEP_BATCH)


async def sweep_forever(pool: Pool) -> None:
    while True:
        await asyncio.sleep(SWEEP_SECONDS)
        try:
            await sweep(pool)
        except Exception as exc:  # noqa: BLE001 - the database may be restarting
            log.info("stream sweep failed, retried later: %s", exc)
