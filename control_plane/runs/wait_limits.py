"""Nothing waits forever unnoticed: a run waiting too long for one kind of thing fails.

Each kind of wait on a person or an outside event (an approval, an unknown outcome's
answer, a held repeat, a connection, a signal, a child run, a published event) has a limit
per workspace: the platform's DEFAULT_SECONDS unless the workspace chose another
(WorkspaceAdminService.SetWaitLimit, `agentrun workspaces set-wait-limit`); 0 turns a
kind off, by choice. The loop fails the runs past their kind's limit on the database
clock, with a finish step naming the limit; the run's approvals and questions close in
the same transaction (migration 0042). Waits on time (a sleep, a rate limit, a retry)
are bounded by the run's own limits, not here.
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import datetime
from typing import Any

from control_plane.store.db import Pool, transaction
from control_plane.store.queries import run

log = logging.getLogger(__name__)

KINDS = ("approval", "human", "repeat", "connection", "signal", "child", "event")
DEFAULT_SECONDS = 30 * 86400
MIN_SECONDS = 60
MAX_SECONDS = 10 * 365 * 86400
BATCH = 100


def effective(stored: Any) -> dict[str, int]:
    """Every kind's limit in seconds: the workspace's choice, else the default (0 = off)."""
    chosen = json.loads(stored) if isinstance(stored, str) else dict(stored or {})
    return {kind: int(chosen.get(kind, DEFAULT_SECONDS)) for kind in KINDS}


async def fail_overdue(pool: Pool, now: datetime | None = None) -> list[Any]:
    """Fail the runs waiting past their kind's limit; returns (workspace, run, error) rows."""
    failed: list[Any] = []
    for ws in await run(pool, "runs_waiting_workspaces", BATCH, list(KINDS), MIN_SECONDS):
        workspace_id = ws["workspace_id"]
        row = await run(pool, "workspace_get", workspace_id)
        limits = {k: v for k, v in effective(row["wait_limits"] if row else {}).items() if v > 0}
        if not limits:
            continue
        async with transaction(pool) as conn:
            failed += await run(
                conn, "run_fail_waited_too_long", workspace_id, json.dumps(limits), BATCH, now
            )
    return failed


async def run_forever(pool: Pool, interval: float, poke: Any) -> None:
    """The wait-limit loop of one replica (replicas skip each other's locked rows)."""
    while True:
        try:
            if await fail_overdue(pool):
                poke()  # a parent may wait for a child that just failed
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the database may be restarting
            log.warning("wait limits failed, retrying: %s", exc)
        await asyncio.sleep(interval)
