"""Fast-path deltas across replicas: Postgres LISTEN/NOTIFY on one connection per replica.

An executor streams a run's model output to the replica it is connected to; its
watchers may be connected to any replica. Every replica listens on one channel
(`agentrun_deltas`, control_plane/store/notify.py: its own connection, not the
pool's) and says on it which runs its watchers watch (`w`: at once when a run's
first watcher comes, and again every INTEREST_REFRESH_SECONDS while any does).
The replica holding a run's stream publishes that run's deltas (`d`) only while
another replica said it watches it in the last INTEREST_TTL_SECONDS; a run nobody
watches elsewhere costs nothing. Deltas that come while a NOTIFY is on its way go
out together in the next one: one NOTIFY in flight per replica, each under 8000
bytes. A replica checks, before it publishes, what it checks for its own
watchers (the stream holds the run at that epoch: deltas.DeltaHub.offer); the
receiving one drops a delta of an older epoch than one it delivered.

Nothing of this is stored and nothing on the durable path waits for it; the
committed decision step stays the record. What a watcher on another replica sees
when a delta is lost (the relay's connection down or reconnecting, more waiting
than PENDING_LIMIT, a delta over the size limit, or the first few milliseconds of
a call before its watch was heard): a gap in RunDelta.index, or no deltas at all,
and then the committed steps as always. Payloads (compact JSON):
`{"r": replica, "w": [[workspace, run], ...]}` and
`{"r": replica, "d": [[workspace, run, epoch, seq, index, text], ...]}`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import Counter

from agentrun.v1 import run_pb2
from control_plane.ops import metrics
from control_plane.store.notify import MAX_PAYLOAD_BYTES, Listening

log = logging.getLogger(__name__)

CHANNEL = "agentrun_deltas"
INTEREST_REFRESH_SECONDS = 5.0
INTEREST_TTL_SECONDS = 3 * INTEREST_REFRESH_SECONDS
PENDING_LIMIT = 4096  # deltas waiting for the next NOTIFY; more are dropped
RECONNECT_SECONDS = 1.0

Key = tuple[str, uuid.UUID]

RELAYED = Counter(
    "agentrun_delta_relay_deltas",
    "Fast-path deltas relayed between replicas: sent, received, dropped (no connection, "
    "too many waiting, too large)",
    ["outcome"],
    registry=metrics.REGISTRY,
)


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class DeltaRelay:
    """One replica's side of the channel. `deliver` hands a delta heard from another
    replica to this one's watchers; `watched` names the runs they watch."""

    def __init__(
        self, deliver: Callable[[Key, run_pb2.RunDelta], None], watched: Callable[[], list[Key]]
    ) -> None:
        self.replica = uuid.uuid4().hex[:12]
        self._deliver = deliver
        self._watched = watched
        self._interest: dict[Key, dict[str, float]] = {}  # replica -> until (monotonic)
        self._deltas: list[str] = []
        self._watches: list[str] = []
        self._wake = asyncio.Event()
        self._channel: Listening | None = None

    def watched_elsewhere(self, key: Key) -> bool:
        """Whether another replica said lately that its watchers watch this run."""
        replicas = self._interest.get(key)
        if not replicas:
            return False
        now = time.monotonic()
        for replica in [r for r, until in replicas.items() if until < now]:
            del replicas[replica]
        if not replicas:
            del self._interest[key]
        return bool(replicas)

    def announce(self, keys: Iterable[Key]) -> None:
        """Tell the other replicas that this one's watchers watch these runs."""
        if self._channel is None:
            return  # said again when the connection is back
        self._watches += [_compact([ws, str(run_id)]) for ws, run_id in keys]
        self._wake.set()

    def publish(self, key: Key, delta: run_pb2.RunDelta) -> None:
        """Send a delta of a run this replica's stream holds, if another replica watches it."""
        if not self.watched_elsewhere(key):
            return
        if self._channel is None or len(self._deltas) >= PENDING_LIMIT:
            RELAYED.labels("dropped").inc()
            return
        ws, run_id = key
        self._deltas.append(
            _compact([ws, str(run_id), delta.epoch, delta.seq, delta.index, delta.text])
        )
        self._wake.set()

    def heard(self, payload: str) -> None:
        """A payload on the channel (this replica's own ones are skipped)."""
        try:
            message = json.loads(payload)
            if not isinstance(message, dict) or message.get("r") == self.replica:
                return
            for ws, run in message.get("w") or []:
                until = time.monotonic() + INTEREST_TTL_SECONDS
                self._interest.setdefault((ws, uuid.UUID(run)), {})[message["r"]] = until
            for ws, run, epoch, seq, index, text in message.get("d") or []:
                RELAYED.labels("received").inc()
                delta = run_pb2.RunDelta(epoch=epoch, seq=seq, index=index, text=text)
                self._deliver((ws, uuid.UUID(run)), delta)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            log.debug("ignored a malformed delta relay payload: %s", exc)

    def payloads(self) -> list[str]:
        """Everything waiting, as NOTIFY payloads under the size limit (taken: sent once)."""
        watches, self._watches = self._watches, []
        deltas, self._deltas = self._deltas, []
        sent = self._packed("d", deltas)
        RELAYED.labels("sent").inc(sum(len(batch) for batch in sent))
        return [self._payload("w", batch) for batch in self._packed("w", watches)] + [
            self._payload("d", batch) for batch in sent
        ]

    def _payload(self, kind: str, batch: list[str]) -> str:
        return f'{{"r":"{self.replica}","{kind}":[' + ",".join(batch) + "]}"

    def _packed(self, kind: str, items: list[str]) -> list[list[str]]:
        """The items in batches whose payloads stay under the size limit."""
        room = MAX_PAYLOAD_BYTES - len(self._payload(kind, []))
        batches: list[list[str]] = []
        size = room + 1
        for item in items:
            length = len(item.encode()) + 1
            if length > room:
                RELAYED.labels("dropped").inc()  # a delta too large to go at all
                continue
            if size + length > room:
                batches.append([])
                size = 0
            batches[-1].append(item)
            size += length
        return batches

    def forget_stale(self) -> None:
        """Drop what other replicas said about runs they no longer watch."""
        for key in list(self._interest):
            self.watched_elsewhere(key)

    async def run_forever(self, dsn: str) -> None:
        """Listen and send while this replica runs; reconnect when the connection is lost."""
        while True:
            try:
                channel = await Listening.open(dsn, CHANNEL, self.heard)
            except Exception as exc:  # noqa: BLE001 - the database may be restarting
                log.info("delta relay cannot connect: %s", exc)
                await asyncio.sleep(RECONNECT_SECONDS)
                continue
            self._channel = channel
            try:
                await self._serve(channel)
            except Exception as exc:  # noqa: BLE001 - a failed NOTIFY: drop, reconnect
                log.info("delta relay lost its connection: %s", exc)
            finally:
                self._channel = None
                self._deltas, self._watches = [], []
                await channel.close()
            await asyncio.sleep(RECONNECT_SECONDS)

    async def _serve(self, channel: Listening) -> None:
        lost = asyncio.ensure_future(channel.lost())
        refresh_at = 0.0
        try:
            while not lost.done():
                self._wake.clear()
                if time.monotonic() >= refresh_at:
                    self.announce(self._watched())
                    self.forget_stale()
                    refresh_at = time.monotonic() + INTEREST_REFRESH_SECONDS
                for payload in self.payloads():
                    await channel.send(payload)
                wake = asyncio.ensure_future(self._wake.wait())
                timeout = max(0.0, refresh_at - time.monotonic())
                await asyncio.wait({wake, lost}, timeout=timeout, return_when="FIRST_COMPLETED")
                wake.cancel()
        finally:
            lost.cancel()
