"""WatchRun for blocking code: iterate a run's events, reconnecting after UNAVAILABLE from the
seq after the last step it yielded (the server sends from that offset, so no step is seen
twice or missed)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from agentrun.v1 import run_pb2, run_pb2_grpc

RetryHook = Callable[[grpc.RpcError, float], None]


class RunWatch:
    """Iterates WatchRun events (raw messages); after UNAVAILABLE it reconnects from the last
    seq + 1.

    `cancel()` (from any thread) ends the iteration quietly. `timeout` bounds the whole watch
    (DEADLINE_EXCEEDED). A stream is resumed for `retry_for` seconds of unreachability before
    the UNAVAILABLE error is raised; with `retry_unopened` False, only a stream that delivered
    events is (a wrong address then fails at once, as the CLI wants).
    """

    def __init__(
        self,
        stub: run_pb2_grpc.RunServiceStub,
        workspace: str,
        run_id: str,
        from_seq: int = 0,
        timeout: float | None = None,
        on_retry: RetryHook | None = None,
        retry_for: float = 60.0,
        retry_unopened: bool = False,
        deltas: bool = False,
        channel: grpc.Channel | None = None,
    ) -> None:
        """`channel`: the stub's, watched while waiting to reconnect (see Client._pause)."""
        self._stub = stub
        self._channel = channel
        self._request = run_pb2.WatchRunRequest(
            workspace_id=workspace, run_id=run_id, from_seq=from_seq, deltas=deltas
        )
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._on_retry = on_retry
        self._retry_for = retry_for
        self._retry_unopened = retry_unopened
        self._cancelled = threading.Event()
        self._lock = threading.Lock()
        self._call: grpc.Call | None = None
        self._delivered = False
        self.run: run_pb2.Run | None = None
        """The last run state the stream sent."""
        self.reconnects = 0

    @property
    def next_seq(self) -> int:
        """The first seq not seen yet (the resume offset)."""
        return self._request.from_seq

    def cancel(self) -> None:
        self._cancelled.set()
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()

    def __iter__(self) -> Iterator[run_pb2.WatchRunResponse]:
        delay, down_since = 0.2, None
        while not self._cancelled.is_set():
            try:
                for event in self._open():
                    down_since, delay = None, 0.2
                    self._note(event)
                    yield event
                return
            except grpc.RpcError as err:
                if self._cancelled.is_set():
                    return
                down_since = down_since or time.monotonic()
                self._check_retry(err, down_since, delay)
                if self._on_retry is not None:
                    self._on_retry(err, delay)
                self.reconnects += 1
                self._pause(delay)
                delay = min(delay * 2, 5.0)

    def _pause(self, delay: float) -> None:
        if self._channel is None:
            self._cancelled.wait(delay)
            return
        with contextlib.suppress(grpc.FutureTimeoutError):
            grpc.channel_ready_future(self._channel).result(timeout=delay)

    def _open(self) -> Iterator[run_pb2.WatchRunResponse]:
        remaining = None if self._deadline is None else max(self._deadline - time.monotonic(), 0)
        call = self._stub.WatchRun(self._request, timeout=remaining)
        with self._lock:
            self._call = call
        if self._cancelled.is_set():
            call.cancel()
        return call  # type: ignore[no-any-return]

    def _check_retry(self, err: grpc.RpcError, down_since: float, delay: float) -> None:
        """Re-raise unless the error is UNAVAILABLE and there is time left to retry."""
        if err.code() != grpc.StatusCode.UNAVAILABLE:
            raise err
        if not (self._delivered or self._retry_unopened):
            raise err
        now = time.monotonic()
        if now + delay - down_since > self._retry_for:
            raise err
        if self._deadline is not None and now + delay >= self._deadline:
            raise err

    def _note(self, event: run_pb2.WatchRunResponse) -> None:
        self._delivered = True
        if event.HasField("step"):
            self._request.from_seq = max(self._request.from_seq, event.step.seq + 1)
        elif event.HasField("run"):
            self.run = event.run
