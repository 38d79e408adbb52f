"""The stream client's fixed choices: reconnect backoff, channel options, and how queued
requests go out (commits queued together go in one Commits message, in order, within the
control plane's byte bound; every other request alone, in its place)."""

from __future__ import annotations

import asyncio
import random

from agentrun.v1 import executor_pb2 as pb
from executor.stream import BACKOFF_CAP, CHANNEL_OPTIONS, MAX_COMMITS_TOGETHER, _drain, backoff


def test_reconnect_backoff_starts_at_a_tenth_of_a_second_and_caps_at_two():
    random.seed(3)
    first = [backoff(0) for _ in range(50)]
    assert all(0.05 <= d <= 0.1 for d in first)
    assert all(0.1 <= backoff(1) <= 0.2 for _ in range(50))
    assert all(BACKOFF_CAP / 2 <= backoff(n) <= BACKOFF_CAP for n in range(5, 40))


def test_channel_accepts_large_assignments_and_keeps_alive():
    options = dict(CHANNEL_OPTIONS)
    assert options["grpc.max_receive_message_length"] == 64 * 1024 * 1024
    assert options["grpc.keepalive_time_ms"] > 0


def commit(n: int, payload: str = "{}") -> pb.ConnectRequest:
    step = pb.NewStep(seq=1, payload_json=payload)
    return pb.ConnectRequest(commit=pb.Commit(request_id=n, steps=[step]))


def ping(n: int) -> pb.ConnectRequest:
    return pb.ConnectRequest(ping=pb.Ping(request_id=n))


def sent(queued: list[pb.ConnectRequest | None], bound: int) -> list[tuple[str, list[int]]]:
    """What `_drain` sends for requests queued before it runs: (kind, request ids) each."""

    async def collect() -> list[pb.ConnectRequest]:
        queue: asyncio.Queue[pb.ConnectRequest | None] = asyncio.Queue()
        for request in queued:
            queue.put_nowait(request)
        return [request async for request in _drain(queue, lambda: bound)]

    out = []
    for request in asyncio.run(collect()):
        kind = request.WhichOneof("msg")
        if kind == "commits":
            out.append((kind, [c.request_id for c in request.commits.commits]))
        elif kind == "commit":
            out.append((kind, [request.commit.request_id]))
        else:
            out.append((kind, [request.ping.request_id]))
    return out


def test_commits_queued_together_go_in_one_message_and_nothing_changes_places():
    queued = [commit(1), commit(2), commit(3), ping(7), commit(4), ping(8), commit(5), commit(6)]
    assert sent([*queued, None], 1 << 20) == [
        ("commits", [1, 2, 3]),
        ("ping", [7]),
        ("commit", [4]),
        ("ping", [8]),
        ("commits", [5, 6]),
    ]
    # A half-close behind a batch still ends the stream after it; nothing after it goes.
    assert sent([commit(1), commit(2), None, commit(3)], 1 << 20) == [("commits", [1, 2])]


def test_an_older_control_plane_gets_every_commit_alone():
    assert sent([commit(1), commit(2), commit(3), None], 0) == [
        ("commit", [1]),
        ("commit", [2]),
        ("commit", [3]),
    ]


def test_a_batch_stays_within_the_control_planes_byte_bound():
    big = "x" * 1000
    size = commit(1, big).commit.ByteSize()
    queued = [commit(n, big) for n in range(1, 6)]
    # Room for two such commits a message: 2 + 2 + 1, in order.
    assert sent([*queued, None], 2 * size + size // 2) == [
        ("commits", [1, 2]),
        ("commits", [3, 4]),
        ("commit", [5]),
    ]
    # One larger than the bound goes alone, between batches.
    huge = commit(9, "y" * 10 * size)
    assert sent([commit(1), huge, commit(2), commit(3), None], 3 * size) == [
        ("commit", [1]),
        ("commit", [9]),
        ("commits", [2, 3]),
    ]


def test_a_batch_holds_at_most_its_count():
    n = MAX_COMMITS_TOGETHER + 3
    got = sent([*(commit(i) for i in range(n)), None], 1 << 30)
    assert [len(ids) for _, ids in got] == [MAX_COMMITS_TOGETHER, 3]
    assert [i for _, ids in got for i in ids] == list(range(n))
