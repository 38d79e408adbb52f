"""One stream's liveness on the control plane: Pong every Ping, declare a silent stream
dead, and when a stream ends let its runs be taken over soon instead of at lease expiry.

Pings write nothing (no Postgres); only the release at the end of a stream does, once.
Why releasing at `last Ping received + H + margin` is safe: control_plane/store/sql/lease.sql
("Release on break").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from prometheus_client import Counter

from agentrun.v1 import executor_pb2 as pb
from control_plane.ground.config import ServerConfig
from control_plane.ops.metrics import REGISTRY
from control_plane.store import lease as lease_store
from control_plane.store.db import Pool

log = logging.getLogger(__name__)

SILENT = Counter(
    "agentrun_executor_streams_silent",
    "Executor streams declared dead because no Ping arrived in time (half-open connections)",
    registry=REGISTRY,
)
RELEASED = Counter(
    "agentrun_leases_released_on_break",
    "Leases of a broken executor stream made claimable before their expiry",
    registry=REGISTRY,
)

Clock = Callable[[], float]


class Peer(Protocol):
    """What liveness needs of its stream (the session of dispatch/session.py)."""

    id: str
    executor_id: str
    liveness: Liveness

    def send(self, msg: pb.ConnectResponse) -> None: ...

    def close(self) -> None: ...


class Liveness:
    """When the stream's executor last pinged, and whether the stream is dead."""

    def __init__(self, config: ServerConfig, clock: Clock = time.monotonic) -> None:
        self.horizon = config.send_horizon_seconds
        self.margin = config.release_margin_seconds
        self.dead_after = config.stream_dead_seconds
        self._clock = clock
        # None until the first Ping: an executor that never pings (an older release)
        # is never declared silent, and its runs wait out their lease.
        self.last_ping: float | None = None
        self.dead = False

    def on_ping(self, session: Peer, ping: pb.Ping) -> None:
        """Note the time (before answering: the Pong must never outrun it), answer at once."""
        self.last_ping = self._clock()
        if not self.dead:
            session.send(pb.ConnectResponse(pong=pb.Pong(request_id=ping.request_id)))

    def release_in(self) -> float | None:
        """Seconds from now until the runs of this (ended) stream may be taken over; None
        when only their lease may decide (no horizon, or the executor never pinged)."""
        if self.horizon <= 0 or self.last_ping is None:
            return None
        return max(0.0, self.last_ping + self.horizon + self.margin - self._clock())

    async def watch(self, session: Peer) -> None:
        """Declare the stream dead once a pinging executor has been silent `dead_after`
        seconds: nothing more is assigned to it, and it is closed."""
        if self.horizon <= 0:
            return
        poll = min(0.25, self.dead_after / 4)
        while True:
            if self.last_ping is None:
                await asyncio.sleep(poll)
                continue
            silent_for = self._clock() - self.last_ping
            if silent_for <= self.dead_after:
                # Wake at the deadline itself, not up to a poll later: a paused executor's
                # runs are taken over that much sooner (a Ping in between moves it on).
                await asyncio.sleep(min(poll, self.dead_after - silent_for + 0.005))
                continue
            self.dead = True  # first: the dispatcher reads it before every assignment
            SILENT.inc()
            log.warning(
                "executor %s's stream (session %s) silent for %.1fs: declared "
                "dead, assigning it nothing more",
                session.executor_id,
                session.id,
                silent_for,
            )
            session.close()
            return


async def release_on_break(
    pool: Pool, session: Peer, leases: list[lease_store.LeaseKey], poke: Callable[[], None]
) -> None:
    """The stream ended: the runs it held (`leases`) may be taken over at `last Ping + H +
    margin`; the dispatcher is woken then, so the claim follows at once."""
    delay = session.liveness.release_in()
    if delay is None or not leases:
        return
    try:
        moved = await lease_store.release_on_break(pool, session.executor_id, leases, delay)
    except Exception as exc:  # noqa: BLE001 - the leases lapse on their own
        log.warning("could not release executor %s's leases early: %s", session.executor_id, exc)
        return
    if not moved:
        return
    RELEASED.inc(len(moved))
    log.info(
        "executor %s's stream (session %s) ended: %d runs claimable in %.2fs",
        session.executor_id,
        session.id,
        len(moved),
        delay,
    )
    asyncio.get_running_loop().call_later(delay + 0.02, poke)
