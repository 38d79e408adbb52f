"""The send horizon on an injected clock: who may start a tool request, and when (executor),
and when a broken stream's runs may be taken over (control plane)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from agentrun.v1 import executor_pb2, tool_pb2
from control_plane.dispatch.liveness import Liveness
from control_plane.ground.config import ServerConfig
from executor.config import ExecutorConfig
from executor.horizon import SEND_GATE, SESSION_GONE, STALE, Refused, SendHorizon
from executor.lease import LEASE_UNSAFE, NOT_HELD, LeaseKeeper
from executor.models.provider_http import ProviderHttp
from executor.tools import definitions
from executor.tools.catalogue import Catalogue, Tool
from executor.tools.http_tool import HttpToolClient
from tests.harness.http_stub import reply, serving


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def lease(run_id: str = "r1") -> executor_pb2.Lease:
    return executor_pb2.Lease(workspace_id="w", run_id=run_id, epoch=2)


def keeper(clock: Clock) -> LeaseKeeper:
    async def heartbeat(leases, within):
        return None

    horizon = SendHorizon(clock)
    return LeaseKeeper(heartbeat, lambda run, why: None, clock=clock, horizon=horizon)


def test_a_send_needs_an_acknowledgement_younger_than_the_horizon_counted_from_its_send():
    clock = Clock()
    leases = keeper(clock)
    leases.horizon.begin(1.5)
    leases.hold(lease())
    assert leases.send_refusal("r1") == STALE  # nothing acknowledged yet
    sent_at = clock.now
    clock.now += 0.4  # the Pong comes back 0.4 s later: the horizon counts from the send
    leases.horizon.ack(sent_at)
    assert leases.send_refusal("r1") is None
    clock.now = sent_at + 1.49
    assert leases.send_refusal("r1") is None
    clock.now = sent_at + 1.5
    assert leases.send_refusal("r1") == STALE
    leases.horizon.ack(sent_at - 1.0)  # a late answer to an older Ping moves nothing back
    assert leases.send_refusal("r1") == STALE


def test_a_lease_carried_over_a_reconnect_never_sends_again_but_a_new_one_does():
    clock = Clock()
    leases = keeper(clock)
    leases.horizon.begin(1.5)
    leases.hold(lease("old"))
    leases.horizon.ack(clock.now)
    assert leases.send_refusal("old") is None
    leases.horizon.end()  # the stream broke (or was declared silent)
    assert leases.send_refusal("old") == SESSION_GONE
    assert leases.carried_over("old")  # already while reconnecting
    leases.horizon.begin(1.5)
    leases.horizon.ack(clock.now)
    leases.hold(lease("new"))
    assert leases.carried_over("old") and not leases.carried_over("new")
    assert leases.send_refusal("old") == SESSION_GONE
    assert leases.send_refusal("new") is None


def test_without_a_horizon_the_lease_alone_decides():
    clock = Clock()
    leases = keeper(clock)
    leases.horizon.begin(0.0)  # an older control plane announced none
    leases.hold(lease())
    assert leases.send_refusal("r1") is None
    assert not leases.carried_over("r1")
    clock.now += leases.lease_duration - leases.margin
    assert leases.send_refusal("r1") == LEASE_UNSAFE
    assert leases.send_refusal("unknown") == NOT_HELD


async def test_a_stale_horizon_is_waited_out_until_an_acknowledgement_arrives():
    clock = Clock()
    leases = keeper(clock)
    leases.horizon.begin(1.5)
    leases.hold(lease())
    waiting = asyncio.create_task(leases.wait_to_send("r1"))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    leases.horizon.ack(clock.now)
    assert await asyncio.wait_for(waiting, 1.0) is None


async def test_a_wait_for_the_horizon_ends_when_the_stream_is_gone():
    clock = Clock()
    leases = keeper(clock)
    leases.horizon.begin(1.5)
    leases.hold(lease())
    waiting = asyncio.create_task(leases.wait_to_send("r1"))
    await asyncio.sleep(0.05)
    leases.horizon.end()
    assert await asyncio.wait_for(waiting, 1.0) == SESSION_GONE


class Session:
    def __init__(self) -> None:
        self.sent: list[executor_pb2.ConnectResponse] = []
        self.closed = False
        self.executor_id, self.id = "ex", "s1"

    def send(self, msg: executor_pb2.ConnectResponse) -> None:
        self.sent.append(msg)

    def close(self) -> None:
        self.closed = True


def test_the_control_plane_releases_at_the_last_ping_received_plus_horizon_and_margin():
    clock = Clock()
    config = ServerConfig(database_url="", send_horizon_seconds=1.5, release_margin_seconds=0.5)
    liveness = Liveness(config, clock)
    assert liveness.release_in() is None  # never pinged (an older executor): its lease decides
    session = Session()
    liveness.on_ping(session, executor_pb2.Ping(request_id=7))
    assert [m.pong.request_id for m in session.sent] == [7]
    clock.now += 0.5
    assert liveness.release_in() == 1.5
    clock.now += 5.0
    assert liveness.release_in() == 0.0
    off = Liveness(dataclasses.replace(config, send_horizon_seconds=0.0), clock)
    off.on_ping(session, executor_pb2.Ping(request_id=8))
    assert off.release_in() is None


async def test_a_silent_stream_is_declared_dead_and_closed():
    clock = Clock()
    config = ServerConfig(database_url="", stream_dead_seconds=0.2)
    liveness = Liveness(config, clock)
    session = Session()
    liveness.on_ping(session, executor_pb2.Ping(request_id=1))
    watch = asyncio.create_task(liveness.watch(session))  # type: ignore[arg-type]
    await asyncio.sleep(0.1)
    assert not liveness.dead
    clock.now += 0.3
    await asyncio.wait_for(watch, 1.0)
    assert liveness.dead and session.closed
    liveness.on_ping(session, executor_pb2.Ping(request_id=2))
    assert [m.pong.request_id for m in session.sent] == [1]  # a dead stream answers nothing


def _registry_tool(url: str) -> Tool:
    """A workspace's HTTP tool from a template (executor/tools/template.py), no credential."""
    return definitions.from_proto(
        tool_pb2.Tool(
            name="notify",
            version=1,
            parameters_json='{"type": "object"}',
            access=tool_pb2.TOOL_ACCESS_WRITE,
            idempotency=tool_pb2.IDEMPOTENCY_CLASS_PROVIDER_KEY,
            idempotency_header="Idempotency-Key",
            http=tool_pb2.HttpTemplate(method="POST", url=f"{url}/notify"),
        )
    )


@pytest.mark.parametrize("registry", [False, True], ids=["catalogue", "registry-template"])
async def test_the_last_moment_check_keeps_a_request_from_leaving_past_the_horizon(
    registry: bool,
) -> None:
    clock = Clock()
    leases = keeper(clock)
    leases.horizon.begin(1.5)
    leases.hold(lease())
    leases.horizon.ack(clock.now)
    message = {"channel": "#sales", "text": "hi"}

    async with serving(lambda r: reply(json={"ok": True})) as provider:
        tools = HttpToolClient(ExecutorConfig(providers_url=provider.url))

        async def send_as_run() -> None:  # a task of its own, as each run is
            SEND_GATE.set(lambda: leases.send_refusal("r1"))
            tool = _registry_tool(provider.url) if registry else Catalogue.load().get("chat_post")
            await tools.send(tool, message, "r1:5")

        await asyncio.create_task(send_as_run())
        assert len(provider.seen) == 1
        clock.now += 1.5
        # The connection the first call left open is there: only the check holds it back,
        # on our side: Refused, never a tool's NotSent (which would become its result).
        with pytest.raises(Refused, match="no recent liveness acknowledgement"):
            await asyncio.create_task(send_as_run())
        assert len(provider.seen) == 1  # nothing left
        await tools.aclose()


async def test_a_model_request_takes_the_last_moment_check_too() -> None:
    """A model request is a send: a holder stopped past its horizon must not ask the model
    what its successor asks (the takeover test's "no re-ask"); held back, nothing leaves."""
    clock = Clock()
    leases = keeper(clock)
    leases.horizon.begin(1.5)
    leases.hold(lease())
    leases.horizon.ack(clock.now)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

    async with serving(lambda r: reply(json={"ok": True})) as provider:
        model = ProviderHttp(5.0, secret="sk-test")

        async def ask_as_run() -> None:  # a task of its own, as each run is
            SEND_GATE.set(lambda: leases.send_refusal("r1"))
            await model.post(f"{provider.url}/v1/chat/completions", body, {})

        await asyncio.create_task(ask_as_run())
        assert len(provider.seen) == 1
        clock.now += 1.5
        with pytest.raises(Refused, match="no recent liveness acknowledgement"):
            await asyncio.create_task(ask_as_run())
        assert len(provider.seen) == 1  # nothing left
        await model.aclose()
