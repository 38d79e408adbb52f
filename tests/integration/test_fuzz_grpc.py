"""Every RPC of every service, fuzzed against a real control plane and Postgres.

The methods come from the service descriptors (a new RPC is fuzzed without touching
this file). Each gets >= 300 generated messages (NUL characters, invalid UUIDs, huge and
negative numbers, enum values out of range, oversized strings, deep JSON in JSON fields)
and undecodable bytes (random bytes, invalid UTF-8 in a string field, truncated fields).
Each call carries a credential its access-table entry admits (tests/harness/fuzzing.py
`Callers`), so the messages reach the handlers; a share of the calls instead carry a
missing, malformed, unknown, forged or revoked credential and must be UNAUTHENTICATED,
undecodable and NUL-bearing requests too: the credential is checked before the request's
content is judged (a stream authenticates when it opens, so the executor stream is
UNAUTHENTICATED whatever its frames hold).
Promised: no INTERNAL or UNKNOWN, no hang (every call has a deadline), no row written by
a refused request, no traceback in the log, and the server still serving at the end.
(A refused executor stream may have read a valid Hello before the refused frame: that
Hello makes its release known, a row that outlives the stream by design; what the Hello
declared is forgotten before the stream's status is sent.)
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
from control_plane.ground.config import ServerConfig
from control_plane.ground.decoding import Refused, guard_decoder
from control_plane.ground.errors import PER_ITEM_FIELDS
from control_plane.server import RunningServer, start
from tests.harness.connect_probe import CLIENT_WRITE_FAILED
from tests.harness.fuzzing import (
    Callers,
    Fuzzer,
    Metadata,
    Rpc,
    TableCounts,
    invalid_variants,
    methods,
    undecodable,
)
from tests.harness.logs import tracebacks

MESSAGES_PER_METHOD = 300
UNDECODABLE_PER_METHOD = 40
GARBAGE_SHARE = 0.12  # of the calls, sent with a credential that is no credential
DEADLINE = 5.0
# A server-streaming call may be a watch that outlives its deadline; that is not a hang.
WATCH_DEADLINE = 1.0
BAD = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
# Bulk actions write batch by batch and stream their progress: one cut off by its deadline
# keeps what its finished batches did (control_plane/api/bulk.py), by design.
PROGRESSIVE = {"BulkCancelRuns", "BulkRerunRuns", "BulkMoveRunsRelease"}
RPCS = methods()


def _identity(data: bytes) -> bytes:
    return data


@pytest.fixture
async def quiet_server(db_url: str) -> AsyncIterator[RunningServer]:
    """A control plane whose background loops do not write during the test (long polls)."""
    config = ServerConfig(
        database_url=db_url,
        listen="127.0.0.1:0",
        scheduler_poll_seconds=3600,
        push_poll_seconds=3600,
        approval_poll_seconds=3600,
    )
    running = await start(config)
    yield running
    await running.stop(grace=0)


@pytest.fixture
async def callers(db_url: str) -> Callers:
    return await Callers.mint(db_url)


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
        self.reached: Counter[str] = Counter()  # calls past authentication, by method
        self.shut_out: Counter[str] = Counter()  # garbage credentials refused, by method
        self.undecodable: Counter[str] = Counter()  # undecodable inputs with a real credential

    def record(self, rpc: Rpc, code: grpc.StatusCode, details: str, what: str) -> None:
        self.codes[(rpc.name, code.name)] += 1
        hang = code == grpc.StatusCode.DEADLINE_EXCEEDED and not rpc.server_streaming
        if code in BAD or hang:
            self.bad.append(f"{rpc.path} {code.name} {details[:120]!r} for {what}")

    def admitted(self, rpc: Rpc, code: grpc.StatusCode, details: str, what: str) -> None:
        """A call with a credential the method admits: never refused as unauthenticated."""
        if code == grpc.StatusCode.UNAUTHENTICATED or "credential may not call" in details:
            self.bad.append(f"{rpc.path} refused its credential: {details[:120]!r} for {what}")
        else:
            self.reached[rpc.name] += 1

    def garbage(
        self,
        rpc: Rpc,
        code: grpc.StatusCode,
        expected: grpc.StatusCode,
        what: str,
        details: str,
    ) -> None:
        if code != expected:
            self.bad.append(
                f"{rpc.path} {code.name} (not {expected.name}) {details[:160]!r} for garbage {what}"
            )
        elif code == grpc.StatusCode.UNAUTHENTICATED:
            self.shut_out[rpc.name] += 1


Result = tuple[grpc.StatusCode, str]


async def _unary(ch: grpc.aio.Channel, rpc: Rpc, data: bytes, metadata: Metadata) -> Result:
    deadline = WATCH_DEADLINE if rpc.server_streaming else DEADLINE
    try:
        if rpc.server_streaming:
            call = ch.unary_stream(rpc.path, _identity, _identity)(
                data, timeout=deadline, metadata=metadata
            )
            async for _ in call:
                pass
        else:
            await ch.unary_unary(rpc.path, _identity, _identity)(
                data, timeout=deadline, metadata=metadata
            )
    except grpc.aio.AioRpcError as err:
        return err.code(), err.details() or ""
    return grpc.StatusCode.OK, ""


async def _bidi(ch: grpc.aio.Channel, rpc: Rpc, frames: list[bytes], metadata: Metadata) -> Result:
    """One bidi stream (the executor's Connect): send the frames, half-close, read to the end.

    A write racing the server's end of the call (a refused credential, a refused first
    frame) fails on the client side, which then reports an INTERNAL of its own in place
    of the server's status (grpc/grpc#36066). The server read only the frames written
    before it, so the stream is opened again with just those, to hear its real answer.
    """
    call = ch.stream_stream(rpc.path, _identity, _identity)(timeout=DEADLINE, metadata=metadata)
    written = 0
    try:
        for frame in frames:
            await call.write(frame)
            written += 1
        await call.done_writing()
        async for _ in call:
            pass
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
        pass  # the call's status says what happened
    code, details = await call.code(), await call.details() or ""
    if written < len(frames) and (code, details) == (grpc.StatusCode.INTERNAL, CLIENT_WRITE_FAILED):
        return await _bidi(ch, rpc, frames[:written], metadata)
    return code, details


async def _call(ch: grpc.aio.Channel, rpc: Rpc, frames: list[bytes], metadata: Metadata) -> Result:
    if rpc.client_streaming:
        return await _bidi(ch, rpc, frames, metadata)
    return await _unary(ch, rpc, frames[0], metadata)


def _before_authentication(rpc: Rpc, frames: list[bytes]) -> grpc.StatusCode:
    """What a call with a garbage credential gets: UNAUTHENTICATED, whatever its request
    holds (only a message over the transport's size limit is refused before any handler)."""
    if not rpc.client_streaming and len(frames[0]) > ServerConfig.max_message_bytes:
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return grpc.StatusCode.UNAUTHENTICATED


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


async def _seed_agent(ch: grpc.aio.Channel, callers: Callers) -> None:
    """An agent that generated requests can name (ws/agent), so some get past lookup."""
    agents = agent_pb2_grpc.AgentServiceStub(ch)
    await agents.CreateAgent(
        agent_pb2.CreateAgentRequest(workspace_id="ws", agent_id="agent"),
        metadata=callers.metadata("/agentrun.v1.AgentService/CreateAgent"),
    )
    spec = agent_pb2.AgentSpec(model="writer", instructions="fuzz", tools=["echo"])
    await agents.PublishAgentVersion(
        agent_pb2.PublishAgentVersionRequest(workspace_id="ws", agent_id="agent", spec=spec),
        metadata=callers.metadata("/agentrun.v1.AgentService/PublishAgentVersion"),
    )


def _order(rpcs: list[Rpc]) -> list[Rpc]:
    # The executor stream first, while no run exists that the dispatcher could hand it;
    # the workspace admin service last, so a fuzzed plan change comes after the rest.
    return sorted(rpcs, key=lambda r: (not r.client_streaming, "Admin" in r.service))


def _written_before_refusal(rpc: Rpc, frames: list[bytes]) -> set[str]:
    """Tables a refused stream's frames before the refused one may write: a Hello's release."""
    if not rpc.client_streaming:
        return set()
    decode = guard_decoder(rpc.request_class().FromString, PER_ITEM_FIELDS)  # as served
    assert decode is not None
    for frame in frames:
        message = decode(frame)
        if isinstance(message, Refused):
            return set()
        if message.WhichOneof("msg") == "hello":
            return {"releases"}
    return set()


async def _fuzz(
    channel: grpc.aio.Channel, callers: Callers, rpc: Rpc, seed: int, ledger: Ledger
) -> AsyncIterator[tuple[grpc.StatusCode, str, set[str]]]:
    """Call `rpc` with each input, a share of them with a garbage credential."""
    rng = random.Random(seed)
    for what, frames in _inputs(rpc, seed):
        garbage = rng.random() < GARBAGE_SHARE
        metadata = callers.garbage(rng) if garbage else callers.metadata(rpc.path, rng)
        code, details = await _call(channel, rpc, frames, metadata)
        ledger.record(rpc, code, details, what)
        if garbage:
            expected = _before_authentication(rpc, frames)
            ledger.garbage(rpc, code, expected, f"{metadata} {what}", details)
        elif not what.startswith("undecodable"):
            ledger.admitted(rpc, code, details, what)
        else:
            ledger.undecodable[rpc.name] += 1
        yield code, what, set() if garbage else _written_before_refusal(rpc, frames)


async def test_every_rpc_survives_generated_and_undecodable_requests(
    quiet_server: RunningServer,
    channel: grpc.aio.Channel,
    callers: Callers,
    db: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    await _seed_agent(channel, callers)
    assert len(RPCS) >= 35, [r.path for r in RPCS]
    ledger, started = Ledger(), time.monotonic()
    counts = TableCounts(db)
    before = await counts.now()
    for n, rpc in enumerate(_order(RPCS)):
        async for code, what, allowed in _fuzz(channel, callers, rpc, 1000 + n, ledger):
            after = await counts.now()
            changed = {t: (before[t], after[t]) for t in after if after[t] != before[t]}
            cut = code == grpc.StatusCode.DEADLINE_EXCEEDED and rpc.name in PROGRESSIVE
            if code != grpc.StatusCode.OK and set(changed) - allowed and not cut:
                ledger.writes.append(f"{rpc.path} {code.name} wrote {changed} for {what}")
            if cut:  # the batch in flight when it was cut lands too: counted as its own
                await asyncio.sleep(0.5)
                after = await counts.now()
            before = after
    elapsed = time.monotonic() - started
    assert not ledger.bad, "\n".join(ledger.bad[:30])
    assert not ledger.writes, "\n".join(ledger.writes[:30])
    assert not tracebacks(caplog.records), "\n".join(tracebacks(caplog.records)[:10])
    # Every method was reached and refused undecodable input, from a caller it admits, as
    # the message it is not (from a garbage credential, as unauthenticated).
    for rpc in RPCS:
        undecodable = ledger.undecodable[rpc.name]
        assert ledger.codes[(rpc.name, "INVALID_ARGUMENT")] >= undecodable > 0, rpc.path
        # Its generated messages reached the handler; garbage credentials never did.
        assert ledger.reached[rpc.name] >= MESSAGES_PER_METHOD // 2, rpc.path
        assert ledger.shut_out[rpc.name] >= 5, rpc.path
    await _still_serving(channel, callers)
    print(
        f"fuzzed {len(RPCS)} RPCs in {elapsed:.1f}s ({counts.recounted} recounts): "
        f"{sorted(ledger.codes.items())}"
    )


async def _still_serving(channel: grpc.aio.Channel, callers: Callers) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=DEADLINE)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    agents = agent_pb2_grpc.AgentServiceStub(channel)
    got = await agents.GetAgent(
        agent_pb2.GetAgentRequest(workspace_id="ws", agent_id="agent"),
        timeout=DEADLINE,
        metadata=callers.metadata("/agentrun.v1.AgentService/GetAgent"),
    )
    assert got.agent.agent_id == "agent"
