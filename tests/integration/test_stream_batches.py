"""Batches on the executor stream: several runs, commits or commit results in one message.

A real control plane and raw Connect streams. An executor whose Hello sets reads_batches
gets the runs of one claim together (ConnectResponse.assignments), each whole and held by
it; one without the flag (an older executor) gets one Assignment message a run, as before;
the batch's size bound splits a claim over several messages. The executor's own stream
(executor/stream.py) hands each run of a batch to its handler on its own: one that fails
to start does not keep the others from theirs. The Welcome offers commit batches within a
byte bound; each commit of a Commits message is committed, answered and refused on its
own (a NUL in one is that commit's INVALID, not the stream's end), and the results ready
together go back together only to an executor that reads batches.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import grpc

from agentrun.v1 import executor_pb2, executor_pb2_grpc, run_pb2
from control_plane.dispatch import dispatcher
from control_plane.store import runs
from executor.stream import ControlPlaneStream
from tests import factories
from tests.harness import auth

RUNS = 5
# The tools of the factories' agent version: an executor is assigned only runs whose tools
# it carries.
TOOLS = [
    executor_pb2.ToolDeclaration(name=t, version="1", schema_sha256="0" * 64)
    for t in factories.DEFAULT_SPEC["tools"]
]


async def connect(address: str, key: str, hello: executor_pb2.Hello, slots: int):
    """Open Connect, say Hello, wait for the Welcome and offer `slots` credits at once;
    the channel, the call and the Welcome."""
    channel = grpc.aio.insecure_channel(address)
    call = executor_pb2_grpc.ExecutorServiceStub(channel).Connect(
        metadata=(("authorization", f"Bearer {key}"),), timeout=30
    )
    await call.write(executor_pb2.ConnectRequest(hello=hello))
    welcome = await call.read()
    assert welcome.HasField("welcome")
    await call.write(executor_pb2.ConnectRequest(ready=executor_pb2.Ready(slots=slots)))
    return channel, call, welcome.welcome


async def receive(call, n: int) -> list[executor_pb2.ConnectResponse]:
    """The messages that carried the first n assigned runs."""
    got, messages = 0, []
    while got < n:
        msg = await asyncio.wait_for(call.read(), 10)
        which = msg.WhichOneof("msg")
        if which == "assignment":
            got += 1
        elif which == "assignments":
            got += len(msg.assignments.assignments)
        else:
            continue
        messages.append(msg)
    return messages


def assigned(messages: list[executor_pb2.ConnectResponse]) -> list[executor_pb2.Assignment]:
    out: list[executor_pb2.Assignment] = []
    for msg in messages:
        if msg.HasField("assignment"):
            out.append(msg.assignment)
        else:
            out.extend(msg.assignments.assignments)
    return out


def next_commit(request_id: int, a: executor_pb2.Assignment, text: str) -> executor_pb2.Commit:
    run = a.run
    lease = executor_pb2.Lease(
        workspace_id=run.workspace_id, run_id=run.run_id, epoch=run.lease_epoch
    )
    step = executor_pb2.NewStep(
        seq=max(s.seq for s in a.steps) + 1,
        kind=run_pb2.STEP_KIND_MODEL_DECISION,
        payload_json=json.dumps({"content": text}),
    )
    return executor_pb2.Commit(request_id=request_id, lease=lease, steps=[step])


async def results(call, n: int) -> tuple[list[str], dict[int, executor_pb2.CommitResult]]:
    """The kinds of the messages that carried n commit results, and the results by id."""
    kinds, got = [], {}
    while len(got) < n:
        msg = await asyncio.wait_for(call.read(), 10)
        which = msg.WhichOneof("msg")
        if which == "commit_result":
            got[msg.commit_result.request_id] = msg.commit_result
        elif which == "commit_results":
            got.update((r.request_id, r) for r in msg.commit_results.results)
        else:
            continue
        kinds.append(which)
    return kinds, got


async def test_an_executor_that_reads_batches_gets_a_claims_runs_in_one_message(
    server, db_url, pool
):
    queued = await factories.queued_runs(pool, RUNS)
    address, key = f"127.0.0.1:{server.port}", await auth.executor_key(db_url)
    hello = executor_pb2.Hello(
        executor_id="ex-batch", tools=TOOLS, capacity=RUNS, reads_batches=True
    )
    channel, call, _ = await connect(address, key, hello, RUNS)
    try:
        messages = await receive(call, RUNS)
        # One Ready, one claim: all five runs in one message.
        assert [m.WhichOneof("msg") for m in messages] == ["assignments"]
        got = assigned(messages)
        assert sorted(a.run.run_id for a in got) == sorted(str(r.run_id) for r in queued)
        for a in got:  # each whole: the run leased to this executor, its version, its log
            assert a.run.lease_owner == "ex-batch" and a.run.lease_epoch == 1
            assert a.agent_version.version == queued[0].agent_version
            assert [s.kind for s in a.steps] == [run_pb2.STEP_KIND_INPUT]
        # Held by this stream: a commit of any of them lands.
        await call.write(executor_pb2.ConnectRequest(commit=next_commit(1, got[-1], "hi")))
        _, answered = await results(call, 1)
        assert answered[1].outcome == executor_pb2.COMMIT_OUTCOME_OK
        row = await runs.get_run(pool, got[-1].run.workspace_id, uuid.UUID(got[-1].run.run_id))
        assert (row.status, row.step_count) == ("running", 2)
    finally:
        call.cancel()
        await channel.close()


async def test_an_older_executor_gets_one_assignment_message_a_run(server, db_url, pool):
    queued = await factories.queued_runs(pool, RUNS)
    address, key = f"127.0.0.1:{server.port}", await auth.executor_key(db_url)
    hello = executor_pb2.Hello(executor_id="ex-old", tools=TOOLS, capacity=RUNS)  # no flag
    channel, call, _ = await connect(address, key, hello, RUNS)
    try:
        messages = await receive(call, RUNS)
        assert [m.WhichOneof("msg") for m in messages] == ["assignment"] * RUNS
        assert sorted(a.run.run_id for a in assigned(messages)) == sorted(
            str(r.run_id) for r in queued
        )
    finally:
        call.cancel()
        await channel.close()


async def test_the_size_bound_splits_a_claim_over_several_messages(
    server, db_url, pool, monkeypatch
):
    await factories.queued_runs(pool, RUNS + 1)
    address, key = f"127.0.0.1:{server.port}", await auth.executor_key(db_url)
    hello = executor_pb2.Hello(
        executor_id="ex-small", tools=TOOLS, capacity=RUNS + 1, reads_batches=True
    )
    channel, call, _ = await connect(address, key, hello, 1)
    try:
        (first,) = assigned(await receive(call, 1))  # one credit: one run, alone
        # Room for two assignments like it in a message, not three.
        bound = 2 * first.ByteSize() + first.ByteSize() // 2
        monkeypatch.setattr(dispatcher, "ASSIGNMENT_BATCH_BYTES", bound)
        await call.write(executor_pb2.ConnectRequest(ready=executor_pb2.Ready(slots=RUNS)))
        messages = await receive(call, RUNS)
        counts = [
            len(m.assignments.assignments) if m.HasField("assignments") else 1 for m in messages
        ]
        assert sorted(counts) == [1, 2, 2]
        for m in messages:
            assert sum(a.ByteSize() for a in assigned([m])) <= bound
        assert len({a.run.run_id for a in assigned(messages)} | {first.run.run_id}) == RUNS + 1
    finally:
        call.cancel()
        await channel.close()


class Recording:
    """A StreamHandler that records the runs it starts and refuses one."""

    def __init__(self, refuse: str) -> None:
        self.refuse = refuse
        self.started: list[str] = []
        self.handled = 0
        self.welcomed = asyncio.Event()
        self.all_handled = asyncio.Event()

    def on_welcome(self, welcome: executor_pb2.Welcome) -> None:
        self.welcomed.set()

    def on_assignment(self, assignment: executor_pb2.Assignment) -> None:
        self.handled += 1
        if self.handled == RUNS:
            self.all_handled.set()
        if assignment.run.run_id == self.refuse:
            raise RuntimeError("this run cannot start")
        self.started.append(assignment.run.run_id)

    def on_cancel(self, cancel: executor_pb2.Cancel) -> None:
        pass

    def on_drain(self, drain: executor_pb2.Drain) -> None:
        pass


async def test_the_executors_stream_starts_each_run_of_a_batch_on_its_own(server, db_url, pool):
    queued = await factories.queued_runs(pool, RUNS)
    refused = str(queued[2].run_id)
    handler = Recording(refuse=refused)
    hello = executor_pb2.Hello(
        executor_id="ex-stream", tools=TOOLS, capacity=RUNS, reads_batches=True
    )
    stream = ControlPlaneStream(
        f"127.0.0.1:{server.port}",
        lambda: hello,
        handler,
        credential=await auth.executor_key(db_url),
    )
    stream.start()
    try:
        await asyncio.wait_for(handler.welcomed.wait(), 10)
        assert stream.ready(RUNS)
        await asyncio.wait_for(handler.all_handled.wait(), 10)
        # The refused run (in the middle of the batch) did not keep the others from starting.
        assert sorted(handler.started) == sorted(
            str(r.run_id) for r in queued if str(r.run_id) != refused
        )
    finally:
        await stream.close(grace=0.5)


async def held_stream(server, db_url, pool, executor_id: str, reads_batches: bool):
    """A stream holding RUNS runs; the channel, the call, the Welcome and the assignments."""
    await factories.queued_runs(pool, RUNS)
    hello = executor_pb2.Hello(
        executor_id=executor_id, tools=TOOLS, capacity=RUNS, reads_batches=reads_batches
    )
    channel, call, welcome = await connect(
        f"127.0.0.1:{server.port}", await auth.executor_key(db_url), hello, RUNS
    )
    return channel, call, welcome, assigned(await receive(call, RUNS))


async def test_commits_sent_together_are_each_committed_and_answered_alone(server, db_url, pool):
    channel, call, welcome, held = await held_stream(server, db_url, pool, "ex-c", True)
    try:
        assert welcome.commit_batch_bytes == 1024 * 1024  # 1 MiB: under a quarter of 4 MiB
        batch = [next_commit(i, a, f"step of run {i}") for i, a in enumerate(held, start=1)]
        # One with a NUL (refused for its run alone) and one of a run not held at that epoch.
        batch.append(next_commit(RUNS + 1, held[0], "bad"))
        batch[-1].steps[0].seq += 1
        batch[-1].steps[0].payload_json = '{"content": "a NUL: \x00"}'  # a raw NUL byte
        stale = next_commit(RUNS + 2, held[1], "stale")
        stale.lease.epoch = 7
        batch.append(stale)
        await call.write(executor_pb2.ConnectRequest(commits=executor_pb2.Commits(commits=batch)))
        kinds, got = await results(call, len(batch))
        assert sorted(got) == list(range(1, RUNS + 3))
        outcomes = [got[i].outcome for i in range(1, RUNS + 1)]
        assert outcomes == [executor_pb2.COMMIT_OUTCOME_OK] * RUNS
        assert got[RUNS + 1].outcome == executor_pb2.COMMIT_OUTCOME_INVALID
        assert "NUL" in got[RUNS + 1].message
        assert got[RUNS + 2].outcome == executor_pb2.COMMIT_OUTCOME_FENCED
        # Results ready together went back together: fewer messages than results.
        assert "commit_results" in kinds and len(kinds) < len(batch)
        for a in held:  # every held run has its step, and only it
            row = await runs.get_run(pool, a.run.workspace_id, uuid.UUID(a.run.run_id))
            assert (row.status, row.step_count, row.lease_epoch) == ("running", 2, 1)
        # The stream goes on after the refused commit: one more, alone, lands.
        again = next_commit(99, held[0], "after")
        again.steps[0].seq += 1
        await call.write(executor_pb2.ConnectRequest(commit=again))
        _, last = await results(call, 1)
        assert last[99].outcome == executor_pb2.COMMIT_OUTCOME_OK
    finally:
        call.cancel()
        await channel.close()


async def test_an_older_executor_gets_each_commit_result_alone(server, db_url, pool):
    channel, call, _, held = await held_stream(server, db_url, pool, "ex-o", False)
    try:
        batch = [next_commit(i, a, f"step {i}") for i, a in enumerate(held, start=1)]
        # Sent together, so that their results are ready together.
        await call.write(executor_pb2.ConnectRequest(commits=executor_pb2.Commits(commits=batch)))
        kinds, got = await results(call, RUNS)
        assert kinds == ["commit_result"] * RUNS
        assert all(r.outcome == executor_pb2.COMMIT_OUTCOME_OK for r in got.values())
    finally:
        call.cancel()
        await channel.close()
