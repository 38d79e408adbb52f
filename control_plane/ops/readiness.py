"""Readiness: whether this replica can serve, which today means Postgres answers.

`/healthz` is liveness (the process runs its event loop) and never looks at the
database: restarting a replica because Postgres is down would not help. `/readyz` and
the gRPC health service are readiness: a `SELECT 1` answered within `TIMEOUT`,
remembered for `TTL` so probes and scrapes cost at most one ping a second. `watch()`
keeps the health service in step (NOT_SERVING while the database is unreachable or
silent), so a load balancer or Kubernetes stops sending work to a replica that cannot
do it.

A database that goes silent (packets dropped, no reset) is the hard case: a query
cancelled on such a connection is not given back until the database answers or the
pool's command timeout (30 s) passes, so waiting for the cancellation would keep the
replica SERVING that long. The ping is therefore a task of its own that readiness
stops waiting for at `TIMEOUT`; left running, it ends when the database answers
again, and until then no second ping is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

from grpc_health.v1 import health, health_pb2

from control_plane.store import metrics as store
from control_plane.store.db import Pool

log = logging.getLogger(__name__)

TTL = 1.0
TIMEOUT = 1.0
WATCH_SECONDS = 1.0


class Readiness:
    """The cached answer to "does the database answer?"."""

    def __init__(self, pool: Pool, ttl: float = TTL, timeout: float = TIMEOUT) -> None:
        self._pool = pool
        self._ttl = ttl
        self._timeout = timeout
        self._ready = False
        self._checked_at = float("-inf")
        self._lock = asyncio.Lock()
        self._ping_task: asyncio.Task[bool] | None = None  # the ping still out, if any

    async def ready(self) -> bool:
        async with self._lock:
            if time.monotonic() - self._checked_at >= self._ttl:
                self._ready = await self._ping()
                self._checked_at = time.monotonic()
            return self._ready

    async def _ping(self) -> bool:
        """Whether the database answered within the timeout (the module docstring says why
        a ping that has not is left running rather than cancelled)."""
        if self._ping_task is None:
            self._ping_task = asyncio.create_task(store.ping(self._pool), name="readiness-ping")
        task = self._ping_task
        done, _ = await asyncio.wait({task}, timeout=self._timeout)
        if not done:
            return False
        self._ping_task = None
        # Any failure to answer is "not ready".
        return not task.cancelled() and task.exception() is None and task.result()

    async def watch(
        self,
        servicers: Sequence[tuple[health.aio.HealthServicer, Sequence[str]]],
        every: float = WATCH_SECONDS,
    ) -> None:
        """Set each health servicer's services SERVING or NOT_SERVING as readiness changes."""
        serving: bool | None = True  # _serve() started them SERVING
        while True:
            now = await self.ready()
            if now != serving:
                log.warning(
                    "database %s: health %s",
                    "reachable" if now else "unreachable",
                    "SERVING" if now else "NOT_SERVING",
                )
                status = (
                    health_pb2.HealthCheckResponse.SERVING
                    if now
                    else health_pb2.HealthCheckResponse.NOT_SERVING
                )
                for servicer, names in servicers:
                    for name in ("", *names):
                        with contextlib.suppress(Exception):
                            await servicer.set(name, status)
                serving = now
            await asyncio.sleep(every)


__all__ = ["Readiness"]
