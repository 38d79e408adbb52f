"""The max-age sweep: fail the runs past their max age that no executor holds.

A held run past its max age is the heartbeat's: it refuses to renew the
lease and fails the run. Nobody heartbeats a queued run, a parked one (a
sleep, a backoff, an approval or a person's decision that may never come) or
one whose holder's lease lapsed; this loop fails those, on every replica
(the statement skips rows another replica has locked).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from control_plane.ops import run_figures
from control_plane.store import lease as store
from control_plane.store.db import Pool

log = logging.getLogger(__name__)
BATCH = 100


async def sweep(pool: Pool, on_freed: Callable[[], None]) -> int:
    """Fail every run past its max age that nobody holds; how many it failed."""
    failed = 0
    while rows := await store.fail_past_max_age(pool, BATCH):
        failed += len(rows)
        for row in rows:
            log.info("run %s/%s failed: max age exceeded", row.workspace_id, row.run_id)
            run_figures.FIGURES.finished(pool, row.workspace_id, row.run_id)
        if len(rows) < BATCH:
            break
    if failed:
        on_freed()
    return failed


async def run_forever(pool: Pool, poll_seconds: float, on_freed: Callable[[], None]) -> None:
    while True:
        try:
            await sweep(pool, on_freed)
        except Exception as exc:  # noqa: BLE001 - the database may be restarting
            log.warning("max-age sweep failed, retrying: %s", exc)
        await asyncio.sleep(poll_seconds)
