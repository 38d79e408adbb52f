"""Every RPC of every service, fuzzed against a real control plane and Postgres.

The methods come from the service descriptors (a new RPC is fuzzed without touching
this file). Each gets >= 300 generated messages (NUL characters, invalid UUIDs, huge and
negative numbers, enum values out of range, oversized strings, deep JSON in JSON fields)
and undecodable bytes (random bytes, invalid UTF-8 in a string field, truncated fields).
Promised: no INTERNAL or UNKNOWN, no hang (every call has a deadline), no row written by
a refused request, no traceback in the log, and the server still serving at the end.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentrun.v1 import agent_pb2, agent_pb2_grpc
from control_plane.config import ServerConfig
from control_plane.server import RunningServer, start
from tests.harness.fuzzing import (
    Fuzzer,
    Rpc,
    auth_metadata,
    invalid_variants,
    methods,
    table_counts,
    undecodable,
)

MESSAGES_PER_METHOD = 300
UNDECODABLE_PER_METHOD = 40
DEADLINE = 5.0
# A server-streaming call may be a watch that outlives its deadline; that is not a hang.
WATCH_DEADLINE = 1.0
BAD = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
RPCS = methods()


def _identity(data: bytes) -> bytes:
    return data


@pytest.fixture
async def quiet_server(db_url: str) -> AsyncIterator[RunningServer]:
    """A control plane whose background loops do not write during the test (long polls)."""
    config = ServerConfig(
        database_url=db_url, listen="127.0.0.1:0", scheduler_poll_seconds=3600,
        push_poll_seconds=3600, approval_poll_seconds=3600,
    )  # fmt: skip
    running = await start(config)
    yield running
    await running.stop(grace=0)


@pytest.fixture
async def channel(quiet_server: RunningServer) -> AsyncIterator[grpc.aio.Channel]:
    options = [("grpc.max_send_message_length", 64 * 1024 * 1024)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{quiet_server.port}", options) as ch:
        yield ch


class Ledger:
    """What the calls got, and which refused calls changed a table."""

    def __init__(self) -> None:
        self.codes: Counter[tuple[str, str]] = Counter()
        self.bad: list[str] = []
        self.writes: list[str] = []

    def record(self, rpc: Rpc, code: grpc.StatusCode, details: str, what: str) -> None:
        self.codes[(rpc.name, code.name)] += 1
        hang = code == grpc.StatusCode.DEADLINE_EXCEEDED and not rpc.server_streaming
        if code in BAD or hang:
            self.bad.append(f"{rpc.path} {code.name} {details[:120]!r} for {what}")


async def _unary(ch: grpc.aio.Channel, rpc: Rpc, data: bytes) -> tuple[grpc.StatusCode, str]:
    deadline = WATCH_DEADLINE if rpc.server_streaming else DEADLINE
    try:
        if rpc.server_streaming:
            call = ch.unary_stream(rpc.path, _identity, _identity)(
                data, timeout=deadline, metadata=auth_metadata()
            )
            async for _ in call:
                pass
        else:
            await ch.unary_unary(rpc.path, _identity, _identity)(
                data, timeout=deadline, metadata=auth_metadata()
            )
    except grpc.aio.AioRpcError as err:
        return err.code(), err.details() or ""
    return grpc.StatusCode.OK, ""


async def _bidi(ch: grpc.aio.Channel, rpc: Rpc, frames: list[bytes]) -> tuple[grpc.StatusCode, str]:
    """One bidi stream (the executor's Connect): send the frames, half-close, read to the end."""
    call = ch.stream_stream(rpc.path, _identity, _identity)(
        timeout=DEADLINE, metadata=auth_metadata()
    )
    try:
        for frame in frames:
            await call.write(frame)
        await call.done_writing()
        async for _ in call:
            pass
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
        # A write racing the server's end of the call fails on the client side with an
        # INTERNAL of its own (grpc/grpc#36066); the server's status is the call's code.
        pass
    return await call.code(), await call.details() or ""


async def _call(ch: grpc.aio.Channel, rpc: Rpc, frames: list[bytes]) -> tuple[grpc.StatusCode, str]:
    if rpc.client_streaming:
        return await _bidi(ch, rpc, frames)
    return await _unary(ch, rpc, frames[0])


def _inputs(rpc: Rpc, seed: int) -> list[tuple[str, list[bytes]]]:
    """(description, frames) for one method: generated messages, then undecodable bytes."""
    fuzzer, rng = Fuzzer(seed), random.Random(seed)
    frame_count = (lambda: rng.randint(1, 3)) if rpc.client_streaming else (lambda: 1)
    out = []
    for i in range(MESSAGES_PER_METHOD):
        frames = [fuzzer.message(rpc.request).SerializeToString() for _ in range(frame_count())]
        out.append((f"generated message {i} (seed {seed})", frames))
    bad = [*invalid_variants(rpc.request)]
    bad += [undecodable(rpc.request, rng) for _ in range(UNDECODABLE_PER_METHOD)]
    for i, data in enumerate(bad):
        frames = [fuzzer.message(rpc.request).SerializeToString(), data][-frame_count() :]
        out.append((f"undecodable input {i} {data[:24]!r}", frames))
    return out


async def _seed_agent(ch: grpc.aio.Channel) -> None:
    """An agent that generated requests can name (ws/agent), so some get past lookup."""
    agents = agent_pb2_grpc.AgentServiceStub(ch)
    await agents.CreateAgent(
        agent_pb2.CreateAgentRequest(workspace_id="ws", agent_id="agent"), metadata=auth_metadata()
    )
    spec = agent_pb2.AgentSpec(model="writer", instructions="fuzz", tools=["echo"])
    await agents.PublishAgentVersion(
        agent_pb2.PublishAgentVersionRequest(workspace_id="ws", agent_id="agent", spec=spec),
        metadata=auth_metadata(),
    )


def _tracebacks(records: list[logging.LogRecord]) -> list[str]:
    return [
        f"{r.name}: {r.getMessage()[:200]}"
        for r in records
        if r.exc_info or "Traceback" in r.getMessage()
    ]


def _order(rpcs: list[Rpc]) -> list[Rpc]:
    # The executor stream first, while no run exists that the dispatcher could hand it.
    return sorted(rpcs, key=lambda r: not r.client_streaming)


async def test_every_rpc_survives_generated_and_undecodable_requests(
    quiet_server: RunningServer, channel: grpc.aio.Channel, db: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    caplog.set_level(logging.INFO)
    await _seed_agent(channel)
    assert len(RPCS) >= 25, [r.path for r in RPCS]
    ledger, started = Ledger(), time.monotonic()
    before = await table_counts(db)
    for n, rpc in enumerate(_order(RPCS)):
        for what, frames in _inputs(rpc, seed=1000 + n):
            code, details = await _call(channel, rpc, frames)
            ledger.record(rpc, code, details, what)
            after = await table_counts(db)
            if code != grpc.StatusCode.OK and after != before:
                changed = {t: (before[t], after[t]) for t in after if after[t] != before[t]}
                ledger.writes.append(f"{rpc.path} {code.name} wrote {changed} for {what}")
            before = after
    elapsed = time.monotonic() - started
    assert not ledger.bad, "\n".join(ledger.bad[:30])
    assert not ledger.writes, "\n".join(ledger.writes[:30])
    assert not _tracebacks(caplog.records), "\n".join(_tracebacks(caplog.records)[:10])
    # Every method was reached and refused undecodable input as the message it is not.
    for rpc in RPCS:
        assert ledger.codes[(rpc.name, "INVALID_ARGUMENT")] >= UNDECODABLE_PER_METHOD, rpc.path
    await _still_serving(channel)
    print(f"fuzzed {len(RPCS)} RPCs in {elapsed:.1f}s: {sorted(ledger.codes.items())}")


async def _still_serving(channel: grpc.aio.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=DEADLINE)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    agents = agent_pb2_grpc.AgentServiceStub(channel)
    got = await agents.GetAgent(
        agent_pb2.GetAgentRequest(workspace_id="ws", agent_id="agent"),
        timeout=DEADLINE, metadata=auth_metadata(),
    )  # fmt: skip
    assert got.agent.agent_id == "agent"
