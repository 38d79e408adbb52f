"""Live readers woken together share one read per question (control_plane/http/streams.py
SharedReads): the first asks, the others wait for its answer; a reader that goes away does
not cancel it; a failure reaches every reader; a later read asks again."""

from __future__ import annotations

import asyncio

import pytest

from control_plane.http.streams import SharedReads


async def test_readers_asking_the_same_question_at_once_share_one_read() -> None:
    shared, asked = SharedReads(), []
    gate = asyncio.Event()

    async def read(name: str) -> str:
        asked.append(name)
        await gate.wait()
        return f"tail of {name}"

    readers = [
        asyncio.ensure_future(shared.once(("at", 7, 1), lambda: read("a"))) for _ in range(50)
    ]
    other = asyncio.ensure_future(shared.once(("at", 7, 2), lambda: read("b")))  # a newer wake
    await asyncio.sleep(0)
    readers[0].cancel()  # one reader goes away: the others' read goes on
    gate.set()
    assert await asyncio.gather(*readers[1:]) == ["tail of a"] * 49
    assert await other == "tail of b" and asked == ["a", "b"]
    assert await shared.once(("at", 7, 1), lambda: read("a")) == "tail of a"
    assert asked == ["a", "b", "a"]  # done reads are not kept: the next one asks again


async def test_a_failed_read_reaches_every_reader_and_off_means_each_asks() -> None:
    shared = SharedReads()

    async def broken() -> None:
        await asyncio.sleep(0)
        raise ConnectionError("database away")

    both = [shared.once(("after", 1), broken) for _ in range(2)]
    results = await asyncio.gather(*both, return_exceptions=True)
    assert [type(r) for r in results] == [ConnectionError, ConnectionError]

    off, asked = SharedReads(enabled=False), []

    async def read() -> int:
        asked.append(1)
        await asyncio.sleep(0)
        return 1

    assert await asyncio.gather(*(off.once(("at",), read) for _ in range(3))) == [1, 1, 1]
    assert len(asked) == 3
    with pytest.raises(ConnectionError):
        await shared.once(("after", 1), broken)
