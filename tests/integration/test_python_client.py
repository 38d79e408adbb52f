"""agentrun_client against a real `agentrun dev`: start, watch from an offset, approve, cancel,
list past 200 runs, a retried start, and UNAVAILABLE ridden out (unary calls and watches)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from agentrun.v1 import agent_pb2, approval_pb2
from agentrun_client import (
    AsyncClient,
    Client,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    RetryPolicy,
    Run,
    RunStatus,
    Step,
    StepKind,
)
from agentrun_client.config import dev_credentials
from tests.harness.agentrun_dev import DevProcess, running_dev
from tests.harness.servers import scratch_dir

PAGED_RUNS = 210
ECHOED = "Echoed four times."  # sandbox/scenarios/steps10.json's answer


@pytest.fixture(scope="module")
async def dev(pg: Any, spare_databases: Any, redis_server: Any) -> AsyncIterator[DevProcess]:
    name = await spare_databases.take()
    with (
        scratch_dir("agentrun-pyclient-") as data_dir,
        running_dev(
            data_dir,
            "--address",
            "127.0.0.1:0",
            DATABASE_URL=pg.url_for(name),
            REDIS_URL=redis_server.url,
        ) as running,
    ):
        yield running
    spare_databases.drop(name)


@pytest.fixture(scope="module")
def creds(dev: DevProcess) -> dict[str, Any]:
    return dev_credentials(dev.data_dir)


@pytest.fixture(scope="module")
def client(dev: DevProcess, creds: dict[str, Any]) -> Iterator[Client]:
    with Client(dev.address, workspace="default", api_key=creds["admin_key"]) as c:
        _publish(c, "mailer", "approval", ["send_email"], approvers=[creds["approver"]])
        _publish(c, "worker", "slow_worker", ["echo"])
        _publish(c, "quick", "steps10", ["echo"])
        _publish(c, "pager", "slow_worker", ["echo"], max_concurrency=1)
        yield c


def _publish(
    c: Client,
    agent: str,
    model: str,
    tools: list[str],
    approvers: list[str] | None = None,
    max_concurrency: int = 0,
) -> None:
    """Agents are not the client's business: its channel serves the raw AgentService stub."""
    c.agents.CreateAgent(agent_pb2.CreateAgentRequest(workspace_id="default", agent_id=agent))
    spec = agent_pb2.AgentSpec(model=model, tools=tools, max_concurrency=max_concurrency)
    if approvers:
        spec.approval.CopyFrom(approval_pb2.ApprovalPolicy(tools=tools, approvers=approvers))
    c.agents.PublishAgentVersion(
        agent_pb2.PublishAgentVersionRequest(workspace_id="default", agent_id=agent, spec=spec)
    )


def test_start_watch_approve_and_the_result(
    dev: DevProcess, client: Client, creds: dict[str, Any]
) -> None:
    approver = Client(dev.address, workspace="default", api_key=creds["approver_key"])
    run = client.start_run("mailer", "Write to Ada")
    assert run.status in (RunStatus.QUEUED, RunStatus.RUNNING) and run.input == "Write to Ada"
    seen: list[Step] = []
    for step in client.watch(run.run_id, timeout=60):
        seen.append(step)
        if step.kind == StepKind.APPROVAL_REQUESTED:
            assert client.get_run(run.run_id).wait_reason == "approval"
            # JSON decoded: the payload and the approval's arguments are Python values.
            pending = [a for a in client.list_approvals(state="pending") if a.run_id == run.run_id]
            assert [a.approval_id for a in pending] == [step.payload["approval_id"]]
            assert pending[0].arguments["to"] == "ada@example.com"
            decided = approver.approve(step.payload["approval_id"])
            assert decided.state == "approved" and decided.decided_by == creds["approver"]
    approver.close()
    kinds = [s.kind for s in seen]
    assert [s.seq for s in seen] == list(range(len(seen)))
    assert StepKind.APPROVAL_DECIDED in kinds and kinds[-1] == StepKind.FINISH
    done = client.get_run(run.run_id)
    assert done.status == RunStatus.COMPLETED and done.status.terminal
    assert done.output.startswith("The email tool said:")
    assert done.finish_time is not None and done.finish_time.tzinfo is not None
    # The log read back is the log watched.
    assert [(s.seq, s.kind, s.payload) for s in client.list_steps(run.run_id)] == [
        (s.seq, s.kind, s.payload) for s in seen
    ]


async def test_async_start_and_wait_then_watch_from_an_offset(
    dev: DevProcess, creds: dict[str, Any]
) -> None:
    async with AsyncClient(dev.address, workspace="default", api_key=creds["admin_key"]) as ac:
        run = await ac.start_run("quick", "count")
        steps = [s async for s in ac.watch(run.run_id, from_seq=5)]
        assert [s.seq for s in steps] == list(range(5, 5 + len(steps)))
        assert steps[-1].kind == StepKind.FINISH and steps[-1].payload["output"] == ECHOED
        again = [s async for s in ac.list_steps(run.run_id, from_seq=5, page_size=7)]
        assert [(s.seq, s.payload) for s in again] == [(s.seq, s.payload) for s in steps]
        finished = await ac.wait(run.run_id)
        assert finished.status == RunStatus.COMPLETED and finished.output == ECHOED
        events = [e async for e in ac.watch_events(run.run_id, from_seq=len(steps) + 4)]
        assert isinstance(events[0], Run) and events[0].status == RunStatus.COMPLETED


def test_cancel_and_clear_errors(client: Client) -> None:
    run = client.start_run("worker", "to be cancelled", priority=5)
    cancelled = client.cancel_run(run.run_id, reason="not needed")
    assert cancelled.status == RunStatus.CANCELLED and cancelled.priority == 5
    assert client.get_run(run.run_id).error.endswith("not needed")
    with pytest.raises(NotFound):
        client.get_run("00000000-0000-4000-8000-000000000000")
    with pytest.raises(InvalidArgument) as bad:
        client.start_run("worker", "x", priority=1000)
    assert bad.value.field == "priority"
    with pytest.raises(InvalidArgument) as status:
        next(client.list_runs(status="sleeping"))
    assert status.value.field == "status" and "queued" in status.value.message


def test_a_retried_start_with_the_same_key_returns_the_same_run(client: Client) -> None:
    first = client.start_run("quick", "once", request_id="py-client-test-once")
    again = client.start_run("quick", "once", request_id="py-client-test-once")
    assert again.run_id == first.run_id
    assert [r.run_id for r in client.list_runs(search=first.run_id)] == [first.run_id]
    # Without a key the client makes one per call: two calls, two runs.
    assert client.start_run("quick", "x").run_id != client.start_run("quick", "x").run_id


def test_list_pages_past_200_runs(client: Client) -> None:
    # "pager" runs one at a time (max_concurrency 1): the rest stay queued, cheaply.
    started = {client.start_run("pager", f"n{i}").run_id for i in range(PAGED_RUNS)}
    first = client.list_runs_page(agent="pager", page_size=50)
    assert len(first.items) == 50 and first.next_page_token
    listed = list(client.list_runs(agent="pager", page_size=50))
    assert len(listed) == PAGED_RUNS and {r.run_id for r in listed} == started
    created = [r.create_time for r in listed]
    assert all(
        a is not None and b is not None and a >= b
        for a, b in zip(created, created[1:], strict=False)
    )
    queued = list(client.list_runs(agent="pager", status="queued", page_size=500))
    assert len(queued) >= PAGED_RUNS - 2


# --- UNAVAILABLE ------------------------------------------------------------------------------


class Forwarder:
    """A TCP forwarder on a fixed port that can go away (connections reset, port closed) and
    come back: what a control plane restart looks like to a client."""

    def __init__(self, target: str, port: int) -> None:
        host, tport = target.rsplit(":", 1)
        self.target = (host, int(tport))
        self.port = port
        self.connections = 0
        self._listener: socket.socket | None = None
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen()
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        with self._lock:
            listener, socks, self._listener, self._socks = self._listener, self._socks, None, []
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for s in socks:  # shutdown wakes the pipes blocked in recv(); the peers see the close
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self._lock:
                self.connections += 1
                self._socks += [conn, upstream]
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unavailable_is_retried_and_a_watch_resumes_where_it_was(
    dev: DevProcess, client: Client, creds: dict[str, Any]
) -> None:
    proxy = Forwarder(dev.address, _free_port())
    retry = RetryPolicy(attempts=10, initial=0.1, maximum=1.0)
    via = Client(
        f"127.0.0.1:{proxy.port}", workspace="default", api_key=creds["admin_key"], retry=retry
    )
    try:
        # Nothing listens yet: the start is retried until the control plane answers, and is
        # admitted once (its request id is the same on every attempt).
        threading.Timer(1.0, proxy.up).start()
        began = time.monotonic()
        run = via.start_run("worker", "through the proxy")
        assert time.monotonic() - began >= 0.9
        assert [r.run_id for r in client.list_runs(search="through the proxy")] == [run.run_id]
        # Cut mid-watch: the watch reconnects from the step after the last one it yielded.
        seqs = []
        for step in via.watch(run.run_id, timeout=60):
            seqs.append(step.seq)
            if step.seq == 3:
                proxy.down()
                threading.Timer(0.5, proxy.up).start()
            if step.seq >= 9:
                break
        assert seqs == list(range(10)), seqs
        assert proxy.connections >= 2
    finally:
        via.close()
        proxy.down()


async def test_the_async_client_rides_out_unavailable_too(
    dev: DevProcess, creds: dict[str, Any]
) -> None:
    proxy = Forwarder(dev.address, _free_port())
    retry = RetryPolicy(attempts=10, initial=0.1, maximum=1.0)
    via = AsyncClient(
        f"127.0.0.1:{proxy.port}", workspace="default", api_key=creds["admin_key"], retry=retry
    )
    try:
        threading.Timer(1.0, proxy.up).start()
        run = await via.start_run("worker", "async through the proxy")
        seqs = []
        async for step in via.watch(run.run_id):
            seqs.append(step.seq)
            if step.seq == 3:
                proxy.down()
                threading.Timer(0.5, proxy.up).start()
            if step.seq >= 9:
                break
        assert seqs == list(range(10)), seqs
        assert proxy.connections >= 2
    finally:
        await via.close()
        proxy.down()


def test_events_are_published_once_by_id(client: Client) -> None:
    first = client.publish_event("invoice.paid", {"customer": "py-1"}, event_id="py-evt-1")
    again = client.publish_event("invoice.paid", {"customer": "py-1"}, event_id="py-evt-1")
    assert first.created and not again.created and again.event_id == "py-evt-1"
    assert first.body == {"customer": "py-1"} and first.woke == 0 and first.cancelled == 0
    with pytest.raises(InvalidArgument, match="body"):
        client.publish_event("invoice.paid", [1], event_id="py-evt-2")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="event_name"):
        client.publish_event("no spaces", {}, event_id="py-evt-3")


def test_sessions_forks_and_signals(client: Client) -> None:
    session = client.create_session("quick", title="py", strategy="enqueue")
    assert session.strategy == "enqueue" and session.title == "py"
    turn = client.send_message(session.session_id, "hello", request_id="py-turn-1")
    again = client.send_message(session.session_id, "hello", request_id="py-turn-1")
    assert turn.created and not again.created and again.run_id == turn.run_id
    answered = client.wait(turn.run_id, timeout=60)
    assert answered.status == RunStatus.COMPLETED and answered.output == ECHOED
    # A fork right after a tool result: the model answers that result again.
    results = [s for s in client.list_steps(turn.run_id) if s.kind == StepKind.TOOL_RESULT]
    fork = client.fork_run(turn.run_id, results[0].seq)
    assert fork.forked_from_run_id == turn.run_id and fork.forked_from_seq == results[0].seq
    assert [r.run_id for r in client.list_runs(forked_from=turn.run_id)] == [fork.run_id]
    # A signal to a run that ended is refused, naming why.
    with pytest.raises(FailedPrecondition):
        client.signal_run(turn.run_id, "nudge", {"n": 1}, event_id="e1")
