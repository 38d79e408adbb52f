"""Pure parts of the fast path: which stream a turn goes to, whose deltas reach watchers
(here, and on another replica through the relay's payloads), and how often the executor heartbeats while it holds a fast-path run."""

from __future__ import annotations

import asyncio
import uuid

from agentrun.v1 import executor_pb2 as pb
from agentrun.v1 import run_pb2
from control_plane.dispatch.delta_relay import DeltaRelay
from control_plane.dispatch.deltas import DeltaHub
from control_plane.dispatch.dispatcher import Dispatcher
from control_plane.dispatch.fast_path import pick
from control_plane.dispatch.session import ExecutorSession
from control_plane.ground.config import ServerConfig
from executor.lease import LeaseKeeper


def stream(executor_id: str, credits: int, scope=None, tools=(), draining=False):
    session = ExecutorSession(Dispatcher(None, ServerConfig(database_url="")), scope)  # type: ignore[arg-type]
    session.executor_id, session.slots.credits = executor_id, credits
    session.slots.tools, session.slots.draining = frozenset(tools), draining
    return session


def test_a_turn_goes_to_the_stream_with_most_room_that_a_claim_could_lease_it_to():
    streams = [
        stream("full", 0),
        stream("other-tenant", 9, scope=frozenset({"ws2"})),
        stream("no-tools", 8),
        stream("draining", 7, tools={"send_email"}, draining=True),
        stream("small", 1, tools={"send_email"}),
        stream("roomy", 3, scope=frozenset({"ws"}), tools={"send_email", "crm_lookup"}),
    ]
    assert pick(streams, "ws", ["send_email"]).executor_id == "roomy"
    assert pick(streams, "ws", []).executor_id == "no-tools"
    assert pick(streams, "ws", ["charge_card"]) is None


async def test_only_the_holder_at_that_epoch_reaches_the_watchers():
    hub, run_id = DeltaHub(), uuid.uuid4()
    holder, stale = stream("holder", 0), stream("stale", 0)
    holder.slots.held[run_id], stale.slots.held[run_id] = 2, 1

    def delta(epoch: int, text: str) -> pb.ModelDelta:
        lease = pb.Lease(workspace_id="ws", run_id=str(run_id), epoch=epoch)
        return pb.ModelDelta(lease=lease, seq=1, index=0, text=text)

    with hub.watch("ws", run_id) as queue:
        hub.offer(holder, delta(1, "not its epoch"))
        hub.offer(holder, delta(2, "hello"))
        # The older holder still thinks it holds epoch 1 (not told of the takeover yet).
        hub.offer(stale, delta(1, "stale"))
        got = await asyncio.wait_for(queue.get(), 1)
        assert (got.text, got.epoch, queue.empty()) == ("hello", 2, True)
    hub.offer(holder, delta(2, "nobody watches"))  # dropped, nothing kept
    assert (hub._watchers, hub._epochs) == ({}, {})


async def test_a_fast_path_lease_shortens_the_heartbeat_while_it_is_held():
    async def beat(leases, within):
        return None

    keeper = LeaseKeeper(beat, lambda run_id, reason: None, heartbeat_interval=10.0)
    keeper.hold(pb.Lease(workspace_id="ws", run_id="slow", epoch=1))
    assert keeper.interval == 10.0
    keeper.hold(pb.Lease(workspace_id="ws", run_id="fast", epoch=1), interval=2.0)
    assert keeper.interval == 2.0 and keeper._rescheduled.is_set()
    keeper.drop("fast")
    assert keeper.interval == 10.0


def test_deltas_go_to_another_replica_only_while_it_watches_in_payloads_under_8000_bytes():
    got: list[tuple[object, pb.ModelDelta]] = []
    here = DeltaRelay(lambda key, delta: None, lambda: [])
    there = DeltaRelay(lambda key, delta: got.append((key, delta)), lambda: [])
    here._channel = there._channel = object()  # type: ignore[assignment]  # "connected"
    key = ("ws", uuid.uuid4())
    here.publish(key, run_pb2.RunDelta(epoch=1, seq=1, index=0, text="unwatched"))
    assert here.payloads() == []
    there.announce([key])
    for payload in there.payloads():
        here.heard(payload)
        there.heard(payload)  # its own: skipped
    assert here.watched_elsewhere(key) and not there.watched_elsewhere(key)
    texts = ["é" * 3000, "x" * 9000, *(f"w{i} " for i in range(400))]  # the 9000: too large
    for index, text in enumerate(texts):
        here.publish(key, run_pb2.RunDelta(epoch=1, seq=1, index=index, text=text))
    payloads = here.payloads()
    assert len(payloads) > 1 and all(len(p.encode()) < 8000 for p in payloads)
    for payload in payloads:
        there.heard(payload)
    assert [d.index for _, d in got] == [0, *range(2, len(texts))]
    assert got[0] == (key, run_pb2.RunDelta(epoch=1, seq=1, index=0, text="é" * 3000))
