"""The low-latency fast path: a session turn dispatched by SendMessage itself.

For an agent version flagged `fast_path` (AgentSpec field 11: turns on a
self-hosted model, where time to first token matters), SendMessage admits the
turn exactly as before (one transaction under the session's lock) and, in the
same transaction and request, leases that one run to a connected executor
stream of this replica with a free credit; once the transaction committed it
sends the Assignment. No claim cycle, no poll.

Nothing a claim checks is skipped. The caller was authenticated and its
workspace checked by SendMessage. The stream is picked as a claim groups them
(not draining, its executor credential serving the workspace, carrying every
tool the version needs) and the lease is one conditional UPDATE of exactly that
run (sql/sessions.sql fast_path_lease), a new statement after taking the
workspace row lock a claim takes (so workspace and agent caps hold with claims
and fast paths together, lease.sql's argument), holding the claim's release
routing and tool check again: the queued, due run goes to `running` at epoch +
1, fenced like any lease (every later write names the epoch). Credits are
reserved as after a claim. The lease runs in a savepoint: when no stream has a
free credit, or the UPDATE finds the run not eligible (at a cap, on another
release), or it fails, the turn is committed queued and the claim is poked;
nothing is lost, it only waits for a claim as every other run does. The
Assignment leaves only after the commit: an executor never acts on a lease
that might still roll back.

Its lease. The lease has the server's duration (AGENTRUN_LEASE_SECONDS, 30 s
by default), so every path that renews a lease (heartbeats, commits) keeps it
without a per-run duration; the Assignment tells the executor to renew it every
2 s (AGENTRUN_FAST_PATH_HEARTBEAT_SECONDS) instead of the session's interval.
A fast-path run whose holder died is taken over by the normal claim, which
leases lapsed runs first with every check; the recovery scanner below only
pokes the claim when one lapsed, so it is picked up within a scan however long
the claim's poll is (AGENTRUN_CLAIM_POLL_SECONDS).

Streaming. The executor asks the model with stream=true and forwards the text
deltas on its stream (ConnectRequest.delta); `DeltaHub` fans them out in memory
to WatchRun(deltas=true) watchers of that run on this replica, and through
Postgres LISTEN/NOTIFY to those on other replicas (control_plane/dispatch/
delta_relay.py: only while one watches, batched, best-effort). Deltas are not
stored and come only from the stream holding the run at that epoch; the
committed decision step stays the record.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import Counter, Gauge

from agentrun.v1 import agent_pb2, run_pb2, tool_pb2
from agentrun.v1 import executor_pb2 as pb
from control_plane.credits.claims import reserve_claimed
from control_plane.deploys import releases
from control_plane.dispatch.delta_relay import DeltaRelay, Key
from control_plane.ground import convert
from control_plane.ops import metrics
from control_plane.store import sessions as session_store
from control_plane.store.db import Connection, Pool
from control_plane.store.runs import Run
from control_plane.store.steps import Step

if TYPE_CHECKING:
    from control_plane.dispatch.dispatcher import Dispatcher
    from control_plane.dispatch.session import ExecutorSession

log = logging.getLogger(__name__)
T = TypeVar("T")

FAST_PATH = Counter(
    "agentrun_fast_path_turns",
    "Fast-path session turns by outcome: dispatched (no claim), queued (left to the claim)",
    ["outcome"],
    registry=metrics.REGISTRY,
)
FREE_SLOTS = Gauge(
    "agentrun_free_executor_slots",
    "Free slots (credits) of the executor streams connected to this replica: what a fast-path "
    "turn can be dispatched to",
    registry=metrics.REGISTRY,
)
# A watcher that reads slower than the model writes loses deltas, never the steps.
WATCHER_BUFFER = 1024


def spec_of(version_row: Any) -> dict[str, Any]:
    spec = version_row["spec"]
    return dict(json.loads(spec) if isinstance(spec, str) else spec)


def wanted(version_row: Any) -> bool:
    """Whether turns of this agent version take the fast path."""
    return bool(spec_of(version_row).get("fast_path"))


def set_assignment(
    msg: pb.Assignment,
    run: Run,
    version: agent_pb2.AgentVersion,
    steps: list[Step],
    heartbeat_seconds: float,
    tools: Sequence[tool_pb2.Tool] = (),
) -> None:
    """The Assignment of a run (claimed or fast), with the registry tools its version pinned
    (a fast-path version's says how often to renew), written into the empty `msg` where it
    already is: a message given to a constructor, or appended to a repeated field, is
    copied in."""
    msg.agent_version.CopyFrom(version)
    msg.tools.extend(tools)
    convert.set_run(msg.run, run)
    for s in steps:
        convert.set_step(msg.steps.add(), s)
    if version.spec.fast_path:
        convert.set_duration(msg.heartbeat_interval, heartbeat_seconds)


def code_tools(version: Any) -> list[str]:
    """The tools an executor must carry to run this version: its pinned built-ins (registry
    tools come with the assignment); a version published before the registry, all of them."""
    code = version["code_tools"]
    if code is not None:
        return list(json.loads(code) if isinstance(code, str) else code)
    return list(spec_of(version).get("tools") or [])


def pick(sessions: Sequence[ExecutorSession], workspace_id: str, tools: Sequence[str]) -> Any:
    """The stream with the most free credits that a claim could lease this turn to."""
    needed = set(tools)
    fits = [
        s
        for s in sessions
        if s.credits > 0
        and not s.draining
        and s.executor_id
        and not s.liveness.dead
        and (s.scope is None or workspace_id in s.scope)
        and needed <= s.tools
    ]
    return max(fits, key=lambda s: s.credits, default=None)


@dataclass
class Leased:
    """A fast-path lease taken in the admission's transaction, not yet handed over."""

    session: ExecutorSession
    run: Run
    steps: list[Step]
    metered: bool  # its workspace has a credit account: reserve, as after a claim

    def give_back(self) -> None:
        """The transaction did not commit: the slot taken for it is free again."""
        self.session.credits += 1


class FastPath:
    """Leases fast-path turns to a stream of this replica's dispatcher and hands them over."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher
        self._pool: Pool = dispatcher.pool
        FREE_SLOTS.set_function(lambda: sum(s.credits for s in dispatcher.sessions()))

    async def lease_in(
        self, conn: Connection, workspace_id: str, run_id: uuid.UUID, tools: Sequence[str]
    ) -> list[Leased]:
        """In the admission's transaction (a savepoint of its own): lease the turn just
        admitted to the stream with the most free slots; [] (the turn stays queued, for
        the claim) when none has one or the lease is refused."""
        session = pick(self._dispatcher.sessions(), workspace_id, tools)
        if session is None:
            FAST_PATH.labels("queued").inc()
            return []
        session.credits -= 1  # taken now: a claim running meanwhile cannot spend it too
        config = self._dispatcher.config
        try:
            leased = await session_store.fast_lease(
                conn,
                workspace_id,
                run_id,
                session.executor_id,
                config.lease_seconds,
                carried=sorted(session.tools),
                release=releases.claim_release(session, config),
            )
        except Exception as exc:  # noqa: BLE001 - the savepoint rolled back; the claim takes it
            log.warning("fast path of run %s failed, leaving it to the claim: %s", run_id, exc)
            leased = None
        if leased is None:
            session.credits += 1
            FAST_PATH.labels("queued").inc()
            return []
        return [Leased(session, *leased)]

    async def hand_over(self, leased: Leased) -> bool:
        """After the admission committed: reserve credits as after a claim, then send the
        Assignment. False: the stream went away meanwhile (the run is runnable again), or
        the database failed (the lease lapses and the run is taken over like any other)."""
        try:
            return await self._hand_over(leased)
        except Exception as exc:  # noqa: BLE001 - the turn is committed; its lease will lapse
            leased.session.credits += 1
            log.warning("fast path of run %s could not hand over: %s", leased.run.run_id, exc)
            return False

    async def _hand_over(self, leased: Leased) -> bool:
        session, run = leased.session, leased.run
        if leased.metered and await reserve_claimed(self._pool, [run], {run.workspace_id}):
            session.credits += 1  # out of credits: parked or failed by the reservation
            return True
        if not await self._dispatcher.assign(session, run, leased.steps):
            FAST_PATH.labels("queued").inc()  # its stream went away meanwhile: handed back
            return False
        FAST_PATH.labels("dispatched").inc()
        log.info(
            "run %s of workspace %s dispatched on the fast path to %s (epoch %d)",
            run.run_id,
            run.workspace_id,
            session.executor_id,
            run.lease_epoch,
        )
        return True


class DeltaHub:
    """Model output of fast-path runs, fanned out in memory to this replica's watchers and,
    through the relay (control_plane/dispatch/delta_relay.py), to other replicas' ones."""

    def __init__(self) -> None:
        self._watchers: dict[Key, set[asyncio.Queue[run_pb2.RunDelta]]] = {}
        # The newest epoch whose deltas a watched run's watchers got: an older holder that
        # has not yet learned it was taken over is not heard after the new one.
        self._epochs: dict[Key, int] = {}
        self.relay = DeltaRelay(self.deliver, lambda: list(self._watchers))

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

    def offer(self, session: ExecutorSession, delta: pb.ModelDelta) -> None:
        """Fan out a delta sent by `session` (here and to other replicas' watchers), if
        that stream holds the run at its epoch."""
        lease = delta.lease
        try:
            run_id = uuid.UUID(lease.run_id)
        except ValueError:
            return
        if session.held.get(run_id) != lease.epoch:
            return  # not this stream's lease (fenced, or another's)
        if session.scope is not None and lease.workspace_id not in session.scope:
            return
        key = (lease.workspace_id, run_id)
        event = run_pb2.RunDelta(
            epoch=lease.epoch, seq=delta.seq, index=delta.index, text=delta.text
        )
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


async def recover_forever(pool: Pool, poke: Callable[[], None], every: float) -> None:
    """The fast path's recovery scanner: when a fast-path run's lease lapsed, wake the
    claim, which leases lapsed runs first (with every check) to a stream with room."""
    while True:
        await asyncio.sleep(every)
        try:
            if await session_store.fast_path_lapsed(pool):
                poke()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the database may be restarting
            log.info("fast-path recovery scan failed: %s", exc)


__all__ = [
    "DeltaHub",
    "FastPath",
    "Leased",
    "recover_forever",
    "wanted",
    "with_deltas",
]
