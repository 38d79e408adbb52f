"""The executor's own view of the leases it holds, and the heartbeat that renews them.

Two clocks bound what a run may do. Its lease (renewed by heartbeats, and by the
commits whose result says they renewed it, counted from their send time) bounds
every write: past `valid_until - margin` the run stops itself. The send horizon
(executor/horizon.py) bounds tool requests much more tightly: a request starts
only within H of the last liveness acknowledgement of the session that granted
the lease, so the control plane can let another executor take the run over soon
after the stream breaks instead of at lease expiry. Why that is safe: control_plane/store/sql/lease.sql.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from agentrun.v1 import executor_pb2
from executor.horizon import SESSION_GONE, STALE, SendHorizon

log = logging.getLogger(__name__)

Clock = Callable[[], float]
HeartbeatSender = Callable[
    [Sequence[executor_pb2.Lease], float], Awaitable[executor_pb2.HeartbeatResult | None]
]
Fence = Callable[[str, str], None]

LEASE_UNSAFE = "lease too close to expiry to send a tool request"
NOT_HELD = "the lease is no longer held"


def safety_margin(lease_duration: float) -> float:
    """How close to expiry a lease stops being safe to act on: 20% of it, at least 0.5 s."""
    return max(0.5, 0.2 * lease_duration)


@dataclass
class HeldLease:
    """One run held at one epoch, valid until `valid_until` on the executor's monotonic clock.

    The server renews a lease when it *receives* a heartbeat or a commit that renews; the
    executor only knows when it *sent* it, which is earlier, so counting from
    the send time never overestimates the lease.
    """

    lease: executor_pb2.Lease
    valid_until: float
    # The session whose horizon guards sends under this lease (None: unguarded).
    session: int | None = None
    # Heartbeat at least this often while held (a fast-path run's 2 s); 0: the session's.
    interval: float = 0.0

    @property
    def run_id(self) -> str:
        return self.lease.run_id

    def renew(self, sent_at: float, lease_duration: float) -> None:
        self.valid_until = max(self.valid_until, sent_at + lease_duration)

    def is_safe(self, now: float, margin: float) -> bool:
        return now + margin < self.valid_until


class LeaseKeeper:
    """Holds every lease, heartbeats them together, and fences runs whose lease is lost."""

    def __init__(
        self,
        heartbeat: HeartbeatSender,
        fence: Fence,
        *,
        clock: Clock = time.monotonic,
        lease_duration: float = 30.0,
        heartbeat_interval: float = 10.0,
        horizon: SendHorizon | None = None,
    ) -> None:
        self._heartbeat = heartbeat
        self._fence = fence
        self._clock = clock
        self._leases: dict[str, HeldLease] = {}
        self.lease_duration = lease_duration
        self.heartbeat_interval = heartbeat_interval
        self._rescheduled = asyncio.Event()
        self.horizon = horizon or SendHorizon(clock)

    def configure(self, lease_duration: float, heartbeat_interval: float) -> None:
        """Adopt the durations the control plane announced in its Welcome."""
        if lease_duration > 0:
            self.lease_duration = lease_duration
        if heartbeat_interval > 0 and heartbeat_interval != self.heartbeat_interval:
            self.heartbeat_interval = heartbeat_interval
            # A shorter interval must not wait out a sleep begun under the old one.
            self._rescheduled.set()

    @property
    def margin(self) -> float:
        return safety_margin(self.lease_duration)

    @property
    def interval(self) -> float:
        """How often to heartbeat now: the session's interval, or a held run's shorter one."""
        asked = [h.interval for h in self._leases.values() if h.interval > 0]
        return min([self.heartbeat_interval, *asked])

    def hold(self, lease: executor_pb2.Lease, interval: float = 0.0) -> HeldLease:
        """Start holding a freshly assigned lease (heartbeated every `interval` seconds
        while held, if that is sooner than the session's interval).

        The claim happened just before the assignment arrived; the safety
        margin covers that dispatch delay.
        """
        held = HeldLease(lease, self._clock() + self.lease_duration, self.horizon.grant(), interval)
        sooner = 0 < interval < self.interval
        self._leases[lease.run_id] = held
        if sooner:  # a sleep begun under the longer interval must not be waited out
            self._rescheduled.set()
        return held

    def drop(self, run_id: str) -> None:
        self._leases.pop(run_id, None)

    def get(self, run_id: str) -> HeldLease | None:
        return self._leases.get(run_id)

    def held(self) -> list[executor_pb2.Lease]:
        return [h.lease for h in self._leases.values()]

    def is_safe(self, run_id: str) -> bool:
        held = self._leases.get(run_id)
        return held is not None and held.is_safe(self._clock(), self.margin)

    def send_refusal(self, run_id: str) -> str | None:
        """Why the run may not start a tool request now (None: it may)."""
        held = self._leases.get(run_id)
        if held is None:
            return NOT_HELD
        if not held.is_safe(self._clock(), self.margin):
            return LEASE_UNSAFE
        return self.horizon.refuses(held.session)

    def carried_over(self, run_id: str) -> bool:
        """True if the stream that granted the lease is gone (ended, or replaced by a
        reconnect): the lease will never permit a send again."""
        held = self._leases.get(run_id)
        return held is not None and self.horizon.refuses(held.session) == SESSION_GONE

    async def wait_to_send(self, run_id: str) -> str | None:
        """Wait while only a fresh acknowledgement is missing; None once the run may send,
        else why it may not (for good: the lease is unsafe or its session is gone)."""
        while (refusal := self.send_refusal(run_id)) == STALE:
            await self.horizon.changed(0.1)
        return refusal

    def committed(
        self, run_id: str, epoch: int, result: executor_pb2.CommitResult, sent_at: float
    ) -> None:
        """A commit under this lease landed. It renewed the lease only if its result carries
        lease_expire_time (this executor's Hello set reads_commit_renewal, so the control
        plane renews on commit only when the lease needs it); then it counts from send time."""
        held = self._leases.get(run_id)
        if held is not None and held.lease.epoch == epoch and result.HasField("lease_expire_time"):
            held.renew(sent_at, self.lease_duration)

    async def run(self) -> None:
        """Heartbeat every interval until cancelled."""
        while True:
            started = self._clock()
            try:
                await self.tick()
            except Exception:
                log.exception("heartbeat tick failed")
            elapsed = self._clock() - started
            self._rescheduled.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._rescheduled.wait(), max(0.0, self.interval - elapsed))

    async def tick(self) -> None:
        """Fence what is about to lapse, then renew the rest in one heartbeat."""
        now = self._clock()
        for held in list(self._leases.values()):
            if not held.is_safe(now, self.margin):
                self._lose(held.run_id, "lease would lapse before it could be renewed")
        leases = self.held()
        if not leases:
            return
        sent_at = self._clock()
        result = await self._heartbeat(leases, self.interval)
        if result is not None:
            self.apply(result, sent_at)

    def apply(self, result: executor_pb2.HeartbeatResult, sent_at: float) -> None:
        """Renew the leases the control plane renewed; fence the ones it refused."""
        if not result.checked:
            # The database was unreachable: nothing renewed, nothing refused.
            return
        for status in result.leases:
            held = self._leases.get(status.lease.run_id)
            if held is None or held.lease.epoch != status.lease.epoch:
                continue
            if status.renewed:
                held.renew(sent_at, self.lease_duration)
            else:
                self._lose(held.run_id, status.reason or "lease not renewed")

    def _lose(self, run_id: str, reason: str) -> None:
        self.drop(run_id)
        self._fence(run_id, reason)
