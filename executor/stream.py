"""The executor's end of `ExecutorService.Connect`: one bidi stream, kept alive across restarts."""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import grpc

from agentrun.v1 import executor_pb2, executor_pb2_grpc
from executor.horizon import Refused, SendHorizon
from executor.tools.credentials import ConnectionUnusable, Granted
from executor.transport import ChannelSecurity, open_channel

log = logging.getLogger(__name__)

OK = executor_pb2.COMMIT_OUTCOME_OK
UNAVAILABLE = executor_pb2.COMMIT_OUTCOME_UNAVAILABLE

CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    # The transport's own check for a dead connection, behind the stream's Ping/Pong
    # (which notices a silent stream within seconds); no more often than the
    # control plane permits (grpc.http2.min_ping_interval_without_data_ms: 5 s).
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
    # The channel's own reconnect backoff defaults to 1 s .. 120 s; keep it in
    # step with ours so a restarted control plane is found again quickly.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]

BACKOFF_START = 0.1
BACKOFF_CAP = 2.0
# Liveness: a Ping this often once welcomed with a send horizon; a stream that answers
# none for STREAM_DEAD_SECONDS is declared dead (a half-open connection) and replaced.
PING_SECONDS = 0.5
STREAM_DEAD_SECONDS = 3.0
# How long a tool call waits for its connection token (a refresh included).
TOKEN_TIMEOUT_SECONDS = 20.0
# What the control plane answers when a connection cannot be used for this run.
_UNUSABLE = frozenset(
    {
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.NOT_FOUND,
    }
)


class StreamHandler(Protocol):
    """What the stream hands to the worker."""

    def on_welcome(self, welcome: executor_pb2.Welcome) -> None: ...
    def on_assignment(self, assignment: executor_pb2.Assignment) -> None: ...
    def on_cancel(self, cancel: executor_pb2.Cancel) -> None: ...
    def on_drain(self, drain: executor_pb2.Drain) -> None: ...


@dataclass(frozen=True)
class CommitReply:
    result: executor_pb2.CommitResult
    # When the commit first left: a lease renewed by it counts from here.
    sent_at: float


@dataclass
class _PendingCommit:
    message: executor_pb2.Commit
    future: asyncio.Future[executor_pb2.CommitResult | None]  # None: no reply in time
    first_sent_at: float | None = None


def backoff(failures: int) -> float:
    """Capped exponential backoff with jitter: 0.1 s, 0.2 s … 2 s."""
    delay = min(BACKOFF_CAP, BACKOFF_START * 2**failures)
    return random.uniform(delay / 2, delay)


class ControlPlaneStream:
    """Sends Hello/Ready/Commit/Heartbeat, correlates replies, reconnects when the stream breaks.

    Commits survive a broken stream: every commit without a reply is sent again
    on the next session (the control plane recognises a repeated (run, epoch,
    seq) and acknowledges it), so a caller awaiting `commit()` just waits.
    Heartbeats do not survive: one without a reply renews nothing.
    """

    def __init__(
        self,
        target: str,
        hello: Callable[[], executor_pb2.Hello],
        handler: StreamHandler,
        *,
        clock: Callable[[], float] = time.monotonic,
        options: Sequence[tuple[str, int]] = tuple(CHANNEL_OPTIONS),
        security: ChannelSecurity | None = None,
        credential: str = "",
        ping_seconds: float = PING_SECONDS,
        dead_after: float = STREAM_DEAD_SECONDS,
    ) -> None:
        self._target = target
        # TLS files are read here, so a missing one stops the executor as it starts.
        self._credentials = security.credentials() if security else None
        # The executor credential (AGENTRUN_EXECUTOR_KEY), sent once per stream.
        self._metadata = (("authorization", f"Bearer {credential}"),) if credential else ()
        self._stub: executor_pb2_grpc.ExecutorServiceStub | None = None
        self._hello = hello
        self._handler = handler
        self._clock = clock
        self._options: list[tuple[str, int | str]] = [
            *options,
            *(security.options() if security else []),
        ]
        self._ids = itertools.count(1)
        self._commits: dict[int, _PendingCommit] = {}
        self._heartbeats: dict[int, asyncio.Future[executor_pb2.HeartbeatResult]] = {}
        self._queue: asyncio.Queue[executor_pb2.ConnectRequest | None] | None = None
        self._welcomed = False
        self._had_welcome = False
        # The session's Welcome.commit_batch_bytes: nonzero, commits may go several at once.
        self._commit_batch_bytes = 0
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        # The send horizon (executor/horizon.py): sessions, and their last acknowledged Ping.
        self.horizon = SendHorizon(clock)
        self._ping_seconds, self._dead_after = ping_seconds, dead_after
        self._pings: dict[int, float] = {}
        self._heard_at = 0.0
        self._silent = False

    @property
    def connected(self) -> bool:
        """True between the Welcome and the end of a session."""
        return self._welcomed

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="control-plane-stream")

    async def close(self, grace: float = 2.0) -> None:
        """Half-close the stream, give the control plane `grace` seconds to end it, then cut it."""
        self._closing = True
        if self._queue is not None:
            self._queue.put_nowait(None)
        if self._task is None:
            return
        done, _ = await asyncio.wait({self._task}, timeout=grace)
        if not done:
            self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    def ready(self, slots: int) -> bool:
        """Ask for up to `slots` more assignments; False if there is no session to ask."""
        if slots <= 0:
            return False
        return self._send(executor_pb2.ConnectRequest(ready=executor_pb2.Ready(slots=slots)))

    def withdraw(self, slots: int) -> bool:
        """Take back credits not used yet (draining): `Ready` with a negative count.

        The control plane adds `slots` to the session's credits and clamps at
        zero, so this stops assignments for credits granted earlier.
        """
        if slots <= 0:
            return False
        return self._send(executor_pb2.ConnectRequest(ready=executor_pb2.Ready(slots=-slots)))

    def delta(self, delta: executor_pb2.ModelDelta) -> bool:
        """Send a chunk of a run's model output (lost with a broken stream: not a record)."""
        return self._send(executor_pb2.ConnectRequest(delta=delta))

    async def commit(
        self, commit: executor_pb2.Commit, reply_within: float | None = None
    ) -> CommitReply:
        """Send a commit (again after reconnects) and wait for its result.

        After `reply_within` seconds without a reply the result is UNAVAILABLE: the commit
        may or may not have landed, and sending the same steps again is safe.
        """
        # One copy, into the request itself (the caller may send its message again).
        request = executor_pb2.ConnectRequest()
        message = request.commit
        message.CopyFrom(commit)
        message.request_id = next(self._ids)
        loop = asyncio.get_running_loop()
        pending = _PendingCommit(message, loop.create_future())
        self._commits[message.request_id] = pending
        if self._send(request):
            pending.first_sent_at = self._clock()
        # A timer resolves the future with None when no reply came in time (cheaper than
        # wait_for's wrapping per commit); a late reply then finds it done and is dropped.
        timer = (
            None if reply_within is None else loop.call_later(reply_within, _expire, pending.future)
        )
        try:
            result = await pending.future
        finally:
            # Also on cancellation (a fenced run): it must not be sent again.
            self._commits.pop(message.request_id, None)
            if timer is not None:
                timer.cancel()
        if result is None:
            result = executor_pb2.CommitResult(
                request_id=message.request_id,
                outcome=UNAVAILABLE,
                message="no reply from the control plane in time",
            )
        return CommitReply(result, pending.first_sent_at or self._clock())

    async def connection_token(self, lease: executor_pb2.Lease, connection_id: str) -> Granted:
        """A connection's access token for one call of the run held under `lease`.

        Raises ConnectionUnusable when the control plane refuses (revoked, needs reauth,
        not this run's); horizon.Refused when it cannot be asked: our own failure, never the
        tool's (the call never left; the run hands itself back).
        """
        if self._stub is None:
            raise Refused("no channel to the control plane for the connection's token")
        request = executor_pb2.GetConnectionTokenRequest(lease=lease, connection_id=connection_id)
        try:
            answer = await self._stub.GetConnectionToken(
                request, metadata=self._metadata, timeout=TOKEN_TIMEOUT_SECONDS
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() in _UNUSABLE:
                raise ConnectionUnusable(connection_id, f"is unusable: {exc.details()}") from None
            raise Refused(f"connection token unavailable: {exc.code().name}") from None
        return Granted(tuple(answer.scopes), answer.access_token)

    async def heartbeat(
        self, leases: Sequence[executor_pb2.Lease], reply_within: float
    ) -> executor_pb2.HeartbeatResult | None:
        """One heartbeat for all leases; None when there was no session or no reply in time."""
        request_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        beat = executor_pb2.Heartbeat(request_id=request_id, leases=list(leases))
        if not self._send(executor_pb2.ConnectRequest(heartbeat=beat)):
            return None
        self._heartbeats[request_id] = future
        try:
            return await asyncio.wait_for(future, reply_within)
        except TimeoutError:
            return None
        finally:
            self._heartbeats.pop(request_id, None)

    def _send(self, request: executor_pb2.ConnectRequest) -> bool:
        if not self._welcomed or self._queue is None or self._closing:
            return False
        self._queue.put_nowait(request)
        return True

    async def _run(self) -> None:
        channel, stub = self._open()
        failures = 0
        try:
            while not self._closing:
                try:
                    await self._session(stub)
                except Exception:
                    log.exception("control plane stream failed")
                if self._closing:
                    break
                if self._silent:
                    # Its connection may be black-holed: a new stream on it would be too.
                    await channel.close(grace=None)
                    channel, stub = self._open()
                failures = 0 if self._had_welcome else failures + 1
                await asyncio.sleep(backoff(failures))
        finally:
            self._end_session()
            await channel.close(grace=None)

    def _open(self) -> tuple[grpc.aio.Channel, executor_pb2_grpc.ExecutorServiceStub]:
        channel = open_channel(self._target, self._options, self._credentials)
        self._stub = executor_pb2_grpc.ExecutorServiceStub(channel)
        return channel, self._stub

    async def _session(self, stub: executor_pb2_grpc.ExecutorServiceStub) -> None:
        queue: asyncio.Queue[executor_pb2.ConnectRequest | None] = asyncio.Queue()
        queue.put_nowait(executor_pb2.ConnectRequest(hello=self._hello()))
        self._queue = queue
        self._had_welcome = self._silent = False
        call = stub.Connect(
            _drain(queue, lambda: self._commit_batch_bytes), metadata=self._metadata
        )
        watchdog = asyncio.create_task(self._watch(call), name="stream-liveness")
        try:
            async for response in call:
                self._dispatch(response)
            if not self._closing:
                log.warning("control plane ended the stream")
        except asyncio.CancelledError:
            if not self._silent or cancelling():
                raise
            # The watchdog cancelled the call: a silent stream, already logged.
        except grpc.aio.AioRpcError as exc:
            # Loud once when a working stream breaks; quiet while still unreachable.
            level = logging.WARNING if self._had_welcome else logging.DEBUG
            details = f"{exc.code().name}: {exc.details()}"
            log.log(level, "control plane stream lost (%s); reconnecting", details)
        finally:
            watchdog.cancel()
            self._end_session()

    async def _watch(self, call: grpc.aio.StreamStreamCall[Any, Any]) -> None:
        """Ping while welcomed with a horizon; a stream that answers none for `dead_after`
        seconds is dead (its connection half-open): end it, so the executor reconnects."""
        while True:
            await asyncio.sleep(self._ping_seconds)
            if not self._welcomed or self.horizon.horizon <= 0:
                continue
            silent_for = self._clock() - self._heard_at
            if silent_for > self._dead_after:
                log.warning(
                    "control plane stream silent for %.1fs (no Pong): declaring it "
                    "dead and reconnecting",
                    silent_for,
                )
                self._silent = True
                self.horizon.end()  # before anything else: no send on its leases from now
                call.cancel()
                return
            self._ping()

    def _ping(self) -> None:
        # Read before it is queued, so it can only be earlier than the control plane's receipt.
        request_id, sent_at = next(self._ids), self._clock()
        if self._send(executor_pb2.ConnectRequest(ping=executor_pb2.Ping(request_id=request_id))):
            self._pings[request_id] = sent_at

    def _on_pong(self, pong: executor_pb2.Pong) -> None:
        self._heard_at = self._clock()
        sent_at = self._pings.get(pong.request_id)
        # Pongs come back in order: this one answers every earlier Ping too.
        self._pings = {i: t for i, t in self._pings.items() if i > pong.request_id}
        if sent_at is not None:
            self.horizon.ack(sent_at)

    def _end_session(self) -> None:
        self.horizon.end()
        self._pings.clear()
        self._queue = None
        self._welcomed = False
        self._commit_batch_bytes = 0
        for future in self._heartbeats.values():
            if not future.done():
                future.set_result(None)  # type: ignore[arg-type]
        self._heartbeats.clear()

    def _assign_each(self, assignments: Iterable[executor_pb2.Assignment]) -> None:
        """Each run of a batch on its own, as if it had come alone: one that fails to start
        does not keep the others from theirs."""
        for assignment in assignments:
            try:
                self._handler.on_assignment(assignment)
            except Exception:
                log.exception("handling the assignment of run %s failed", assignment.run.run_id)

    def _dispatch(self, response: executor_pb2.ConnectResponse) -> None:
        kind = response.WhichOneof("msg")
        try:
            if kind == "commit_result":  # the most frequent, first
                self._resolve(response.commit_result)
            elif kind == "commit_results":  # several at once (Hello.reads_batches)
                for result in response.commit_results.results:
                    self._resolve(result)
            elif kind == "assignment":
                self._handler.on_assignment(response.assignment)
            elif kind == "assignments":  # several runs in one message (Hello asked for it)
                self._assign_each(response.assignments.assignments)
            elif kind == "heartbeat_result":
                self._on_heartbeat_result(response.heartbeat_result)
            else:
                self._on_control(kind, response)
        except Exception:
            log.exception("handling %s from the control plane failed", kind)

    def _on_heartbeat_result(self, result: executor_pb2.HeartbeatResult) -> None:
        future = self._heartbeats.get(result.request_id)
        if future is not None and not future.done():
            future.set_result(result)

    def _on_control(self, kind: str | None, response: executor_pb2.ConnectResponse) -> None:
        """The session's rarer messages: its opening, cancels, drains and pongs."""
        if kind == "welcome":
            self._on_welcome(response.welcome)
        elif kind == "cancel":
            self._handler.on_cancel(response.cancel)
        elif kind == "drain":
            self._handler.on_drain(response.drain)
        elif kind == "pong":
            self._on_pong(response.pong)

    def _resolve(self, result: executor_pb2.CommitResult) -> None:
        pending = self._commits.get(result.request_id)
        if pending is not None and not pending.future.done():
            pending.future.set_result(result)

    def _on_welcome(self, welcome: executor_pb2.Welcome) -> None:
        self._welcomed = True
        self._had_welcome = True
        self._commit_batch_bytes = max(0, welcome.commit_batch_bytes)
        self.horizon.begin(welcome.send_horizon.ToNanoseconds() / 1e9)
        self._heard_at = self._clock()
        if self.horizon.horizon > 0:
            self._ping()  # the first acknowledgement opens the horizon: ask for it now
        log.info(
            "connected to control plane %s (session %s, release %s)",
            self._target,
            welcome.session_id,
            welcome.server_release,
        )
        # Commits whose reply was lost with the previous session go again, first.
        now = self._clock()
        for pending in list(self._commits.values()):
            if self._queue is not None:
                self._queue.put_nowait(executor_pb2.ConnectRequest(commit=pending.message))
            if pending.first_sent_at is None:
                pending.first_sent_at = now
        self._handler.on_welcome(welcome)


def _expire(future: asyncio.Future[executor_pb2.CommitResult | None]) -> None:
    if not future.done():
        future.set_result(None)


def cancelling() -> bool:
    """True if this task itself is being cancelled (not just the call it awaited)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


_NOTHING = object()  # _drain: no request taken off the queue ahead
# The most commits in one Commits message (within the control plane's byte bound too).
MAX_COMMITS_TOGETHER = 256


async def _drain(
    queue: asyncio.Queue[executor_pb2.ConnectRequest | None],
    batch_bytes: Callable[[], int] = lambda: 0,
) -> AsyncIterator[executor_pb2.ConnectRequest]:
    """The request side of one session: whatever is queued, until None half-closes it.

    Each message is a grpc write, awaited before the next one leaves, so commits queue up
    behind it under load; with `batch_bytes()` nonzero (the session's Welcome.commit_batch_
    bytes), the commits queued right behind one go with it in one Commits message."""
    carried: object = _NOTHING
    while True:
        request = await queue.get() if carried is _NOTHING else carried
        carried = _NOTHING
        if request is None:
            return
        request = cast(executor_pb2.ConnectRequest, request)
        if not queue.empty() and request.WhichOneof("msg") == "commit" and (bound := batch_bytes()):
            request, carried = _commits_together(request, queue, bound)
        yield request


def _commits_together(
    first: executor_pb2.ConnectRequest,
    queue: asyncio.Queue[executor_pb2.ConnectRequest | None],
    bound: int,
) -> tuple[executor_pb2.ConnectRequest, object]:
    """`first` and the commits queued right behind it, within `bound` bytes of commits, in
    one message; and the first other request taken off the queue, to send next (the order
    of the session's messages is kept)."""
    commits = [first.commit]
    size = first.commit.ByteSize()
    carried: object = _NOTHING
    while not queue.empty() and len(commits) < MAX_COMMITS_TOGETHER and size < bound:
        request = queue.get_nowait()
        if request is None or request.WhichOneof("msg") != "commit":
            carried = request
            break
        n = request.commit.ByteSize()
        if size + n > bound:  # it goes next, alone or first of the next message
            carried = request
            break
        commits.append(request.commit)
        size += n
    if len(commits) == 1:
        return first, carried
    return executor_pb2.ConnectRequest(commits=executor_pb2.Commits(commits=commits)), carried
