"""One executor's bidi stream: Hello, credits, commits (through the pipeline), heartbeats, cancels."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import SpanKind

import faults
from agentrun.v1 import executor_pb2 as pb
from control_plane.dispatch.liveness import Liveness
from control_plane.dispatch.pipeline import COMMIT_TRIES, CommitPipeline, CommitRefused
from control_plane.dispatch.requests import check_size
from control_plane.dispatch.slots import Slots
from control_plane.ground import convert
from control_plane.ground.config import ServerConfig
from control_plane.ground.errors import status_for
from control_plane.ops import metrics, run_figures
from control_plane.store import executor_tools, releases
from control_plane.store import lease as lease_store
from control_plane.store import steps as step_store
from control_plane.store.db import Pool
from control_plane.store.errors import DataRefused, Fenced, transient
from control_plane.store.releases import DrainOrder
from telemetry import logs, tracing

if TYPE_CHECKING:
    from control_plane.dispatch.dispatcher import Dispatcher

log = logging.getLogger(__name__)
_tracer = tracing.tracer(__name__)

_CLOSE = object()
_NOTHING = object()  # serve(): no item taken off the queue ahead
# The most commit results in one message to an executor that reads batches.
MAX_RESULTS_TOGETHER = 256
# The most bytes of commits an executor may send in one Commits message: well under what
# the stream receives (a message over that ends the whole stream, not one run's commit).
COMMIT_BATCH_BYTES = 1024 * 1024
_OUTCOMES = {
    pb.COMMIT_OUTCOME_OK: "ok",
    pb.COMMIT_OUTCOME_FENCED: "fenced",
    pb.COMMIT_OUTCOME_INVALID: "invalid",
    pb.COMMIT_OUTCOME_UNAVAILABLE: "unavailable",
}
# How long a Hello waits for its tools to be recorded before the Welcome goes anyway.
RECORD_TIMEOUT = 2.0
# The stream ended: how long the commits and beats it already sent may still land before
# its leases are released early (Release on break); later ones are cancelled.
SETTLE_ON_BREAK = 2.0


def _is_result(item: object) -> bool:
    return item is not _CLOSE and item.WhichOneof("msg") == "commit_result"  # type: ignore[attr-defined]


def commit_batch_bytes(config: ServerConfig) -> int:
    """Welcome.commit_batch_bytes: COMMIT_BATCH_BYTES, or a quarter of what the executor
    service receives in one message when that is less."""
    return min(COMMIT_BATCH_BYTES, config.executor_receive_bytes // 4)


def lease_key(lease: pb.Lease) -> lease_store.LeaseKey:
    return lease_store.LeaseKey(lease.workspace_id, uuid.UUID(lease.run_id), lease.epoch)


class ExecutorSession:
    """Server side of one Connect stream."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        scope: frozenset[str] | None = None,
        pipeline: CommitPipeline | None = None,
    ) -> None:
        self.id = uuid.uuid4().hex[:12]
        self.executor_id = ""
        # Credits, held runs and what it may be assigned (`scope`: the workspaces this
        # stream's executor credential serves; None: all).
        self.slots = Slots(scope)
        # The executor reads renewals off commit results (Hello.reads_commit_renewal): its
        # commits renew the lease only when it needs it. Else every commit renews it.
        self.reads_commit_renewal = False
        # The executor reads ConnectResponse.assignments and .commit_results (Hello.reads_
        # batches): a claim's runs for this stream, and the commit results ready together,
        # may go in one message. Else one message each.
        self.reads_batches = False
        self._dispatcher = dispatcher
        # Its commits go through the replica's pipeline (with the effects the features
        # registered: control_plane/server.py); none given, plain commits only.
        self._pipeline = pipeline or CommitPipeline(dispatcher.pool, on_runnable=dispatcher.poke)
        # Ping/Pong, a silent stream, release on break (dispatch/liveness.py).
        self.liveness = Liveness(dispatcher.config)
        self._pool: Pool = dispatcher.pool
        self._out: asyncio.Queue[object] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()
        # Each Hello's record of the executor's tools: never cancelled, so the stream's end
        # can wait for it and then forget the row (else a late record outlives the stream).
        self._opening: list[asyncio.Task[None]] = []
        self._ended = False

    def send(self, msg: pb.ConnectResponse) -> None:
        self._out.put_nowait(msg)

    def close(self) -> None:
        """End the stream (its credential was revoked)."""
        self._out.put_nowait(_CLOSE)

    async def serve(
        self, requests: AsyncIterator[pb.ConnectRequest]
    ) -> AsyncIterator[pb.ConnectResponse]:
        reader = asyncio.create_task(self._read(requests))
        try:
            carried: object = _NOTHING
            while True:
                item = await self._out.get() if carried is _NOTHING else carried
                carried = _NOTHING
                if item is _CLOSE:
                    break
                if self.reads_batches and not self._out.empty() and _is_result(item):
                    item, carried = self._results_together(item)  # type: ignore[arg-type]
                yield item  # type: ignore[misc]
        finally:
            self._ended = True
            reader.cancel()
            # What the executor sent before its stream ended lands first, then its leases
            # are released early: a commit landing after the release would renew a lease
            # for a whole term and hold back the takeover (seen on Citus, where a commit
            # takes longer). Cancelled only past SETTLE_ON_BREAK.
            try:
                if self._tasks:
                    await asyncio.wait(list(self._tasks), timeout=SETTLE_ON_BREAK)
            finally:
                for task in list(self._tasks):
                    task.cancel()
                self._dispatcher.unregister(self)
                await self._forget_tools()

    def _results_together(self, first: pb.ConnectResponse) -> tuple[pb.ConnectResponse, object]:
        """`first` and the commit results queued right behind it, in one message (each
        grpc write is awaited before the next, so results ready meanwhile wait in the
        queue); and the first other item taken off the queue, to send next (the order of
        the stream's messages is kept)."""
        results = [first.commit_result]
        carried: object = _NOTHING
        while not self._out.empty() and len(results) < MAX_RESULTS_TOGETHER:
            item = self._out.get_nowait()
            if not _is_result(item):
                carried = item
                break
            results.append(item.commit_result)  # type: ignore[attr-defined]
        if len(results) == 1:
            return first, carried
        return pb.ConnectResponse(commit_results=pb.CommitResults(results=results)), carried

    async def _forget_tools(self) -> None:
        """Its tools no longer count for publishing, once any Hello's record has landed (a
        kill -9 of this replica leaves the row to go stale instead)."""
        if not self._opening:
            return
        try:
            await asyncio.wait(self._opening, timeout=2 * RECORD_TIMEOUT)
            await asyncio.wait_for(executor_tools.forget(self._pool, self.id), RECORD_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - the row goes stale on its own
            log.info("could not forget executor %s's tools: %s", self.executor_id, exc)

    async def _read(self, requests: AsyncIterator[pb.ConnectRequest]) -> None:
        try:
            async for req in requests:
                self._handle(req)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken stream just ends the session
            log.info("session %s (%s) stream ended: %s", self.id, self.executor_id, exc)
        finally:
            self._out.put_nowait(_CLOSE)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _handle(self, req: pb.ConnectRequest) -> None:
        which = req.WhichOneof("msg")
        if which == "hello":
            self._hello(req.hello)
        elif which == "ready":
            self.slots.ready(req.ready.slots)
            self._dispatcher.poke()
        elif which == "commit":
            self._spawn(self._commit(req.commit))
        elif which == "commits":  # several at once (Welcome.commit_batch_bytes): each alone
            for commit in req.commits.commits:
                self._spawn(self._commit(commit))
        elif which == "heartbeat":
            self._spawn(self._heartbeat(req.heartbeat))
        elif which == "ping":
            self.liveness.on_ping(self, req.ping)
        elif which == "delta":  # a run's model output, for its watchers and stream
            self._dispatcher.deltas.offer(self, req.delta)

    def _hello(self, hello: pb.Hello) -> None:
        self.executor_id = hello.executor_id or f"anonymous-{self.id}"
        self.slots.declare(hello)
        self.reads_commit_renewal = hello.reads_commit_renewal
        self.reads_batches = hello.reads_batches
        self._opening.append(asyncio.create_task(self._open(hello)))

    async def _open(self, hello: pb.Hello) -> None:
        """Record the executor's tools for every replica, then welcome it and start assigning."""
        declared = [
            {
                "name": t.name,
                "version": t.version,
                "schema_sha256": t.schema_sha256,
                "capabilities": sorted(t.capabilities),
            }
            for t in hello.tools
        ]
        try:
            # Bounded: a database that is down must not keep the executor from its Welcome.
            await asyncio.wait_for(
                executor_tools.record(
                    self._pool, self.executor_id, self.id, hello.release, self.slots.scope, declared
                ),
                RECORD_TIMEOUT,
            )
        except Exception as exc:  # noqa: BLE001 - assignments need no record; publishing does
            log.warning("could not record executor %s's tools: %s", self.executor_id, exc)
        if self._ended:  # the stream ended meanwhile: it never connected
            return
        with contextlib.suppress(Exception):  # else the dispatcher's next beat records it
            versions = hello.log_version or 1, hello.log_reads_from or 1
            await asyncio.wait_for(
                releases.declared(self._pool, hello.release, *versions), RECORD_TIMEOUT
            )
        if self._ended:  # the stream ended meanwhile: nothing to welcome or assign into
            return
        cfg = self._dispatcher.config
        self.send(
            pb.ConnectResponse(
                welcome=pb.Welcome(
                    session_id=self.id,
                    lease_duration=convert.duration(cfg.lease_seconds),
                    heartbeat_interval=convert.duration(cfg.heartbeat_seconds),
                    server_release=cfg.release,
                    send_horizon=convert.duration(cfg.send_horizon_seconds),
                    commit_batch_bytes=commit_batch_bytes(cfg),
                )
            )
        )
        self._spawn(self.liveness.watch(self))
        with contextlib.suppress(Exception):  # the next beat tells it, if its release drains
            self.drain_if(await asyncio.wait_for(releases.draining(self._pool), RECORD_TIMEOUT))
        if self._ended:
            return
        self._dispatcher.register(self)
        log.info(
            "executor %s connected (session %s, release %s, capacity %d)",
            self.executor_id,
            self.id,
            hello.release,
            hello.capacity,
        )

    async def _commit(self, msg: pb.Commit) -> None:
        """Commit, inside the executor's trace (the message's traceparent) and its log
        context, and answer the executor: ok (with the renewed lease, if renewed), fenced,
        invalid (its run alone), or unavailable (it sends the same commit again)."""
        lease, started = msg.lease, time.monotonic()
        # This task is the commit's own (_spawn): its log context goes with it, unreset.
        logs.bind_for_task(workspace=lease.workspace_id, run=lease.run_id, epoch=lease.epoch)
        result = pb.CommitResult(request_id=msg.request_id)
        with _commit_span(msg, result) if tracing.on() else _NO_SPAN:
            try:
                check_size(msg, self._dispatcher.config.max_message_bytes)
                req = self._pipeline.request(msg, renew_always=not self.reads_commit_renewal)
                if not self.slots.serves(req.workspace_id):
                    raise ValueError("the lease's workspace is outside this credential's scope")
            except (ValueError, KeyError) as exc:
                result.outcome = pb.COMMIT_OUTCOME_INVALID
                result.message = f"malformed commit: {exc}"
            else:
                try:
                    done = await self._pipeline.commit(
                        req, self._dispatcher.config.lease_seconds, msg
                    )
                    faults.point("control_plane.commit.before_reply")
                    self._landed(req, done, result)
                except Fenced as exc:
                    self.slots.drop(req.run_id)
                    result.outcome = pb.COMMIT_OUTCOME_FENCED
                    result.message = str(exc)
                except (DataRefused, CommitRefused) as exc:
                    result.outcome = pb.COMMIT_OUTCOME_INVALID
                    result.message = f"rejected by the database: {exc}"
                except Exception as exc:  # noqa: BLE001 - per-run failure is a message
                    await self._commit_failed(req, exc, result)
        _count(msg, result, time.monotonic() - started)
        self.send(pb.ConnectResponse(commit_result=result))

    def _landed(
        self, req: step_store.CommitRequest, done: step_store.CommitResult, result: pb.CommitResult
    ) -> None:
        """The answer to a commit that landed; a run that may not go on leaves the slots."""
        result.outcome = pb.COMMIT_OUTCOME_OK
        if done.stopped:  # landed, but the run may not go on (out of credits)
            result.outcome = pb.COMMIT_OUTCOME_FENCED
            result.message = done.stopped
            self.slots.drop(req.run_id)
        elif done.status == "running" and done.wake_at is not None:
            if done.renewed:  # else the lease stands as it was: the executor counts nothing
                result.lease_expire_time.CopyFrom(convert.timestamp(done.wake_at))
        else:
            self.slots.drop(req.run_id)

    async def _commit_failed(
        self, req: step_store.CommitRequest, exc: Exception, result: pb.CommitResult
    ) -> None:
        """Transient: UNAVAILABLE (the executor sends the same commit again). Anything else
        would fail again after every takeover: fail the run (fenced by the epoch, in a
        transaction of its own) and tell the executor it no longer holds the run."""
        if transient(exc):
            result.outcome = pb.COMMIT_OUTCOME_UNAVAILABLE
            result.message = "database unavailable, retry later"
            return
        request_id = uuid.uuid4().hex[:12]
        log.error(
            "commit of run %s failed %d times; failing the run (request %s)",
            req.run_id,
            COMMIT_TRIES,
            request_id,
            exc_info=exc,
        )
        reason = f"internal error while committing a step (request {request_id})"
        key = lease_store.LeaseKey(req.workspace_id, req.run_id, req.epoch)
        try:
            failed = await lease_store.fail_held(self._pool, key, reason)
        except Exception as fail_exc:  # noqa: BLE001 - the executor tries again later
            code, message = status_for(fail_exc)
            result.outcome = pb.COMMIT_OUTCOME_UNAVAILABLE
            result.message = message
            return
        self.slots.drop(req.run_id)
        if failed:
            run_figures.FIGURES.finished(self._pool, req.workspace_id, req.run_id)
        result.outcome = pb.COMMIT_OUTCOME_FENCED
        result.message = f"the run failed: {reason}" if failed else "the run is no longer held"

    async def _heartbeat(self, msg: pb.Heartbeat) -> None:
        # One beat carries every run the executor holds (thousands): per lease, only its
        # fields read, its run id parsed, and its status written; no key object unless
        # the lease was refused (liveness CPU: docs/scaling.md, issue 49).
        leases = msg.leases
        workspace_ids = [lease.workspace_id for lease in leases]
        epochs = [lease.epoch for lease in leases]
        try:
            run_ids = [uuid.UUID(lease.run_id) for lease in leases]
        except ValueError:
            log.warning("executor %s sent a heartbeat with a malformed lease", self.executor_id)
            return
        result = pb.HeartbeatResult(request_id=msg.request_id, checked=True)
        try:
            beat = await lease_store.heartbeat_positions(
                self._pool,
                self.executor_id,
                workspace_ids,
                run_ids,
                epochs,
                self._dispatcher.config.lease_seconds,
            )
        except Exception as exc:  # noqa: BLE001 - unknown: renew nothing, refuse nothing
            status_for(exc)
            result.checked = False
            self.send(pb.ConnectResponse(heartbeat_result=result))
            return
        statuses = result.leases
        for i, lease in enumerate(leases):
            run_id = run_ids[i]
            if i in beat.renewed:
                if not self.slots.holds(run_id, epochs[i]):
                    self.slots.hold(lease_store.LeaseKey(workspace_ids[i], run_id, epochs[i]))
                statuses.add(lease=lease, renewed=True)
                continue
            reason = (
                "deadline"
                if i in beat.past_deadline
                else "max_age"
                if i in beat.past_max_age
                else "lost"
            )
            was_held = self.slots.drop(run_id) == epochs[i]
            # Lost, not failed at a limit, and still held here when the answer came: a
            # lease this session had let go meanwhile (its own park or finish, committed
            # while the beat was in flight) was not fenced.
            if reason != "lost":  # failed by the heartbeat's statement: finished here
                run_figures.FIGURES.finished(self._pool, workspace_ids[i], run_id)
            elif was_held:
                metrics.FENCED.labels(workspace_ids[i], "heartbeat").inc()
            statuses.add(lease=lease, renewed=False, reason=reason)
        self.send(pb.ConnectResponse(heartbeat_result=result))
        for i in beat.paused:  # paused through another replica: asked here, each beat
            self.pause(workspace_ids[i], run_ids[i])

    def drain_if(self, draining: Mapping[str, DrainOrder]) -> None:
        """Tell the executor to drain, once (again if the drain is forced later), when its
        release is draining: it is assigned nothing more."""
        order = self.slots.drain(draining)
        if order is not None:
            drain = pb.Drain(release=self.slots.release, force=order.force)
            if order.seconds_left is not None:
                drain.finish_within.CopyFrom(convert.duration(order.seconds_left))
            self.send(pb.ConnectResponse(drain=drain))

    def cancel(self, workspace_id: str, run_id: uuid.UUID, reason: str) -> None:
        epoch = self.slots.drop(run_id)
        if epoch is not None:
            lease = pb.Lease(workspace_id=workspace_id, run_id=str(run_id), epoch=epoch)
            self.send(pb.ConnectResponse(cancel=pb.Cancel(lease=lease, reason=reason)))

    def pause(self, workspace_id: str, run_id: uuid.UUID) -> None:
        """Ask the holder to hand the run back at its next step boundary (it keeps its slot
        until the park lands, as any park)."""
        epoch = self.slots.held.get(run_id)
        if epoch is not None:
            lease = pb.Lease(workspace_id=workspace_id, run_id=str(run_id), epoch=epoch)
            cancel = pb.Cancel(lease=lease, reason="paused", pause=True)
            self.send(pb.ConnectResponse(cancel=cancel))


def _count(msg: pb.Commit, result: pb.CommitResult, took: float) -> None:
    """A commit's metrics: its outcome and time, a fence, a park."""
    workspace = msg.lease.workspace_id
    metrics.commit_outcome(_OUTCOMES.get(result.outcome, "unspecified"), took)
    if result.outcome == pb.COMMIT_OUTCOME_FENCED:
        metrics.FENCED.labels(workspace, "commit").inc()
    elif result.outcome == pb.COMMIT_OUTCOME_OK and msg.HasField("park"):
        metrics.PARKS.labels(workspace, msg.park.wait_reason).inc()


# The commit's span when this process exports none: the hot path makes not even a no-op
# span (as store/queries.py), nor a generator for one.
_NO_SPAN = contextlib.nullcontext()


@contextlib.contextmanager
def _commit_span(msg: pb.Commit, result: pb.CommitResult) -> Iterator[None]:
    """The commit's span, continuing the executor's trace (the message's traceparent), with
    its outcome."""
    lease = msg.lease
    attributes = {
        "agentrun.workspace": lease.workspace_id,
        "agentrun.run": lease.run_id,
        "agentrun.epoch": lease.epoch,
        "agentrun.steps.seq": [step.seq for step in msg.steps],
    }
    with _tracer.start_as_current_span(
        "agentrun.commit.apply",
        context=tracing.context_of(msg.traceparent),
        kind=SpanKind.SERVER,
        attributes=attributes,
    ) as span:
        yield
        span.set_attribute("agentrun.outcome", _OUTCOMES.get(result.outcome, "unspecified"))
