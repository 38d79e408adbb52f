"""Model output for watchers: the replica's hub of WatchRun(deltas=true) queues.

The executor asks the model with stream=true and forwards the text in small chunks on its
stream (ConnectRequest.delta; executor/deltas.py: every agent's calls unless
AGENTRUN_MODEL_STREAM is off); `DeltaHub` fans them out in memory to the watchers of that run on
this replica, and through Postgres LISTEN/NOTIFY to those on other replicas
(dispatch/delta_relay.py: only while one watches, batched, best-effort). They come only
from the stream holding the run at that epoch, and are kept for the run's Durable Stream
(dispatch/delta_store.py) until its decision commits; the committed decision step stays
the record.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any, TypeVar

from agentrun.v1 import executor_pb2 as pb
from agentrun.v1 import run_pb2
from control_plane.dispatch.delta_relay import DeltaRelay, Key
from control_plane.dispatch.delta_store import DeltaStore
from control_plane.dispatch.slots import Stream

T = TypeVar("T")
# A watcher that reads slower than the model writes loses deltas, never the steps.
WATCHER_BUFFER = 1024


class DeltaHub:
    """Model output of runs, fanned out in memory to this replica's watchers and,
    through the relay (control_plane/dispatch/delta_relay.py), to other replicas' ones."""

    def __init__(self) -> None:
        self._watchers: dict[Key, set[asyncio.Queue[run_pb2.RunDelta]]] = {}
        # The newest epoch whose deltas a watched run's watchers got: an older holder that
        # has not yet learned it was taken over is not heard after the new one.
        self._epochs: dict[Key, int] = {}
        self.relay = DeltaRelay(self.deliver, lambda: list(self._watchers))
        # Keeps them for the runs' Durable Streams (set by the server; None: not kept).
        self.store: DeltaStore | None = None

    @contextlib.contextmanager
    def watch(self, workspace_id: str, run_id: uuid.UUID) -> Iterator[asyncio.Queue[Any]]:
        """A queue of the run's deltas while the block lasts."""
        queue: asyncio.Queue[run_pb2.RunDelta] = asyncio.Queue(WATCHER_BUFFER)
        key = (workspace_id, run_id)
        if key not in self._watchers:
            self.relay.announce([key])  # the replica streaming it, if another, sends them
        self._watchers.setdefault(key, set()).add(queue)
        try:
            yield queue
        finally:
            watchers = self._watchers.get(key, set())
            watchers.discard(queue)
            if not watchers:
                self._watchers.pop(key, None)
                self._epochs.pop(key, None)

    def offer(self, session: Stream, delta: pb.ModelDelta) -> None:
        """Fan out a delta sent by `session` (here and to other replicas' watchers), if
        that stream holds the run at its epoch."""
        lease = delta.lease
        try:
            run_id = uuid.UUID(lease.run_id)
        except ValueError:
            return
        if not session.slots.holds(run_id, lease.epoch):
            return  # not this stream's lease (fenced, or another's)
        if not session.slots.serves(lease.workspace_id):
            return
        key = (lease.workspace_id, run_id)
        event = run_pb2.RunDelta(
            epoch=lease.epoch, seq=delta.seq, index=delta.index, text=delta.text
        )
        if self.store is not None:
            self.store.offer(lease.workspace_id, run_id, event)
        self.deliver(key, event)
        self.relay.publish(key, event)

    def deliver(self, key: Key, event: run_pb2.RunDelta) -> None:
        """Hand a delta to this replica's watchers of the run, unless a newer epoch's
        deltas were heard for it."""
        watchers = self._watchers.get(key)
        if not watchers:
            return
        if event.epoch < self._epochs.get(key, 0):
            return  # a holder taken over that has not been told yet
        self._epochs[key] = event.epoch
        for queue in watchers:
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(event)


async def with_deltas(
    feed: AsyncIterator[T], deltas: asyncio.Queue[run_pb2.RunDelta]
) -> AsyncIterator[T | run_pb2.RunDelta]:
    """The feed's items and the deltas, each as it comes (a delta first when both are
    ready: it was generated before any step that came with it); ends with the feed."""
    step: asyncio.Future[T] = asyncio.ensure_future(anext(feed))
    delta: asyncio.Future[run_pb2.RunDelta] = asyncio.ensure_future(deltas.get())
    try:
        while True:
            await asyncio.wait({step, delta}, return_when=asyncio.FIRST_COMPLETED)
            if delta.done():
                yield delta.result()
                delta = asyncio.ensure_future(deltas.get())
                continue
            try:
                item = step.result()
            except StopAsyncIteration:
                return
            yield item
            step = asyncio.ensure_future(anext(feed))
    finally:
        for pending in (step, delta):
            pending.cancel()
        await asyncio.gather(step, delta, return_exceptions=True)
