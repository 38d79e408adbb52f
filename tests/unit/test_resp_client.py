"""The lean Redis client's wire format and failure handling, against a scripted RESP server."""

from __future__ import annotations

import asyncio

import pytest

from executor.ratelimit.resp import RedisUnavailable, RespClient, RespError, encode, parse


def test_commands_are_arrays_of_bulk_strings_numbers_as_redis_py_sends_them():
    assert encode("EVALSHA", "ab", 2, 1e6, b"x") == (
        b"*5\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n2\r\n$9\r\n1000000.0\r\n$1\r\nx\r\n"
    )


@pytest.mark.parametrize(
    ("wire", "value"),
    [
        (b"+OK\r\n", "OK"),
        (b":-42\r\n", -42),
        (b"$3\r\nabc\r\n", b"abc"),
        (b"$-1\r\n", None),
        (b"*2\r\n:1\r\n:0\r\n", [1, 0]),
        (b"*2\r\n*1\r\n$1\r\na\r\n:7\r\n", [[b"a"], 7]),
    ],
)
def test_replies_parse_whole_and_not_before_they_are_complete(wire, value):
    assert parse(wire) == (value, len(wire))
    for cut in range(len(wire)):  # every prefix is incomplete: nothing is consumed
        assert parse(wire[:cut])[1] == 0


def test_an_error_reply_is_returned_as_a_value():
    error, end = parse(b"-NOSCRIPT No matching script\r\n")
    assert isinstance(error, RespError) and "NOSCRIPT" in str(error) and end == 30


async def _server(handler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"redis://:s3cret@127.0.0.1:{port}/2"


async def _read_command(reader: asyncio.StreamReader) -> list[bytes]:
    count = int((await reader.readline())[1:])
    parts = []
    for _ in range(count):
        size = int((await reader.readline())[1:])
        parts.append((await reader.readexactly(size + 2))[:-2])
    return parts


async def test_pipelined_callers_get_their_own_replies_in_order_after_auth_and_select():
    seen: list[list[bytes]] = []

    async def handler(reader, writer):
        while True:
            try:
                command = await _read_command(reader)
            except (asyncio.IncompleteReadError, ValueError):
                return
            seen.append(command)
            if command[0] in (b"AUTH", b"SELECT"):
                writer.write(b"+OK\r\n")
            else:  # answer after a delay, in order, split across writes
                await asyncio.sleep(0.01)
                reply = b":%s\r\n" % command[1]
                writer.write(reply[:2])
                await writer.drain()
                writer.write(reply[2:])

    server, url = await _server(handler)
    client = RespClient(url, timeout=2.0)
    try:
        replies = await asyncio.gather(*(client.command("ECHO", i) for i in range(20)))
        assert replies == list(range(20))
        assert seen[:2] == [[b"AUTH", b"s3cret"], [b"SELECT", b"2"]]
        assert len(seen) == 22  # one connection: authenticated and selected once
    finally:
        await client.aclose()
        server.close()


class _CountedWrites:
    """The connection's own transport, with its writes counted."""

    def __init__(self, transport) -> None:
        self._transport, self.writes = transport, []

    def write(self, data: bytes) -> None:
        self.writes.append(data)
        self._transport.write(data)

    def __getattr__(self, name):
        return getattr(self._transport, name)


async def test_the_commands_of_one_turn_of_the_loop_leave_in_one_write_in_order():
    async def handler(reader, writer):
        while True:
            try:
                command = await _read_command(reader)
            except (asyncio.IncompleteReadError, ValueError, ConnectionError):
                return
            ok = command[0] in (b"AUTH", b"SELECT", b"PING")
            writer.write(b"+OK\r\n" if ok else b":%s\r\n" % command[1])

    server, url = await _server(handler)
    client = RespClient(url, timeout=2.0)
    try:
        assert await client.command("PING") == "OK"  # connected, authenticated, selected
        counted = client._conn.transport = _CountedWrites(client._conn.transport)
        replies = await asyncio.gather(*(client.command("ECHO", i) for i in range(12)))
        assert replies == list(range(12))
        assert counted.writes == [b"".join(encode("ECHO", i) for i in range(12))]
        # A command asked for in a later turn goes in a write of its own.
        assert await client.command("ECHO", 99) == 99
        assert len(counted.writes) == 2
    finally:
        await client.aclose()
        server.close()


async def test_no_reply_in_time_fails_every_waiter_and_the_next_command_reconnects():
    connections = 0

    async def handler(reader, writer):
        nonlocal connections
        connections += 1
        first = connections == 1
        while True:
            try:
                command = await _read_command(reader)
            except (asyncio.IncompleteReadError, ValueError, ConnectionError):
                return
            if command[0] in (b"AUTH", b"SELECT"):
                writer.write(b"+OK\r\n")
            elif not first:  # the first connection never answers a command
                writer.write(b":1\r\n")

    server, url = await _server(handler)
    client = RespClient(url, timeout=0.2)
    try:
        results = await asyncio.gather(
            client.command("PING"), client.command("PING"), return_exceptions=True
        )
        assert all(isinstance(r, RedisUnavailable) for r in results)
        assert await client.command("PING") == 1
        assert connections == 2
    finally:
        await client.aclose()
        server.close()


async def test_a_server_that_is_not_there_is_unavailable_not_a_crash():
    server, url = await _server(lambda r, w: None)
    server.close()
    await server.wait_closed()
    client = RespClient(url, timeout=0.5)
    with pytest.raises(OSError):
        await client.command("PING")
