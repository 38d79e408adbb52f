"""The CLI client's paging and WatchRun resumption, against in-memory stubs (no network)."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from agentrun.v1 import run_pb2
from agentrun_cli.client import Client, RunWatch


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._code.name.lower()


class FakeCall:
    """A WatchRun call: yields its events, then raises `error` if given."""

    def __init__(self, events: list[run_pb2.WatchRunResponse], error: grpc.RpcError | None):
        self._events, self._error = events, error

    def __iter__(self) -> Iterator[run_pb2.WatchRunResponse]:
        yield from self._events
        if self._error is not None:
            raise self._error

    def cancel(self) -> None:
        pass


def step_event(seq: int) -> run_pb2.WatchRunResponse:
    return run_pb2.WatchRunResponse(step=run_pb2.Step(seq=seq, kind=run_pb2.STEP_KIND_INPUT))


class FakeRunStub:
    def __init__(self, calls: list[FakeCall]) -> None:
        self.calls = calls
        self.watch_requests: list[run_pb2.WatchRunRequest] = []
        self.list_requests: list[run_pb2.ListRunsRequest] = []

    def WatchRun(self, req: run_pb2.WatchRunRequest, timeout: float | None = None) -> FakeCall:  # noqa: N802
        self.watch_requests.append(run_pb2.WatchRunRequest(from_seq=req.from_seq))
        return self.calls.pop(0)

    def ListRuns(self, req: run_pb2.ListRunsRequest, timeout: float) -> run_pb2.ListRunsResponse:  # noqa: N802
        self.list_requests.append(
            run_pb2.ListRunsRequest(page_size=req.page_size, page_token=req.page_token)
        )
        start = int(req.page_token or 0)
        runs = [
            run_pb2.Run(run_id=f"r{i}") for i in range(start, min(start + min(req.page_size, 3), 7))
        ]
        token = str(start + len(runs)) if start + len(runs) < 7 else ""
        return run_pb2.ListRunsResponse(runs=runs, next_page_token=token)


def test_watch_resumes_after_unavailable_from_last_seq_plus_one() -> None:
    unavailable = FakeRpcError(grpc.StatusCode.UNAVAILABLE)
    running = run_pb2.WatchRunResponse(run=run_pb2.Run(status=run_pb2.RUN_STATUS_RUNNING))
    stub = FakeRunStub(
        [
            FakeCall([running, step_event(3), step_event(4)], unavailable),
            FakeCall([running, step_event(5)], None),
        ]
    )
    retries: list[float] = []
    watch = RunWatch(stub, "w", "r", from_seq=3, on_retry=lambda err, delay: retries.append(delay))
    seqs = [e.step.seq for e in watch if e.HasField("step")]
    assert seqs == [3, 4, 5]
    assert [r.from_seq for r in stub.watch_requests] == [3, 5]
    assert len(retries) == 1
    assert watch.next_seq == 6
    assert watch.run is not None and watch.run.status == run_pb2.RUN_STATUS_RUNNING


def test_watch_raises_other_errors_and_unreachable_first_connects() -> None:
    not_found = FakeRpcError(grpc.StatusCode.NOT_FOUND)
    with pytest.raises(grpc.RpcError):
        list(RunWatch(FakeRunStub([FakeCall([], not_found)]), "w", "r"))
    unavailable = FakeRpcError(grpc.StatusCode.UNAVAILABLE)
    with pytest.raises(grpc.RpcError):  # never connected: a wrong address fails at once
        list(RunWatch(FakeRunStub([FakeCall([], unavailable)]), "w", "r"))


def test_watch_gives_up_after_retry_window() -> None:
    unavailable = FakeRpcError(grpc.StatusCode.UNAVAILABLE)
    stub = FakeRunStub([FakeCall([step_event(0)], unavailable)])
    watch = RunWatch(stub, "w", "r", retry_for=0.0)
    with pytest.raises(grpc.RpcError):
        list(watch)


def test_cancelled_watch_ends_quietly() -> None:
    cancelled = FakeRpcError(grpc.StatusCode.CANCELLED)
    stub = FakeRunStub([FakeCall([step_event(0)], cancelled)])
    watch = RunWatch(stub, "w", "r")
    events = []
    for event in watch:
        events.append(event)
        watch.cancel()
    assert len(events) == 1


@pytest.mark.parametrize(("limit", "expected"), [(None, 7), (5, 5), (2, 2), (0, 0)])
def test_list_runs_follows_page_tokens_up_to_limit(limit: int | None, expected: int) -> None:
    client = Client("127.0.0.1:1", "w")
    try:
        stub = FakeRunStub([])
        client.runs = stub  # type: ignore[assignment]
        runs = list(client.list_runs(limit=limit))
    finally:
        client.close()
    assert [r.run_id for r in runs] == [f"r{i}" for i in range(expected)]
    assert all(r.page_size <= 500 for r in stub.list_requests)
