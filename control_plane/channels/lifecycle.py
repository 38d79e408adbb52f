"""Run lifecycle webhooks: a webhook channel subscribed to run.completed / run.failed.

A loop reads each subscribed channel's workspace for runs that finished since its
cursor (a window behind it, so a finish that commits late is still found; the runs'
finished index) and queues one outbox row per run and channel, its id derived from both:
reading the window again queues nothing twice, and the relay delivers each at least once
under one webhook-id, signed (control_plane/channels/delivery.py). Not in the finishing
transaction: a finish is on the hot path, and this costs it nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from control_plane.store.db import Pool
from control_plane.store.queries import run

log = logging.getLogger(__name__)

EVENTS = {"run.completed": "completed", "run.failed": "failed"}
WINDOW_SECONDS = 300
BATCH = 100


async def enqueue_once(pool: Pool) -> int:
    """Queue the finished runs every subscribed channel has not been given yet."""
    queued = 0
    for ch in await run(pool, "lifecycle_channels", BATCH):
        config: dict[str, Any] = json.loads(ch["config"])
        statuses = [EVENTS[e] for e in config.get("events", []) if e in EVENTS]
        row = await run(
            pool,
            "lifecycle_enqueue",
            ch["workspace_id"],
            ch["channel_id"],
            statuses,
            config.get("agent_id") or None,
            WINDOW_SECONDS,
        )
        queued += row["queued"] if row else 0
    return queued


async def run_forever(pool: Pool, interval: float) -> None:
    while True:
        try:
            await enqueue_once(pool)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the database may be restarting
            log.warning("run lifecycle webhooks failed, retrying: %s", exc)
        await asyncio.sleep(interval)
