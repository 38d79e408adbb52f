"""An executor's heartbeat, over its real stream, is answered lease by lease (issue 49).

One beat carries every lease the executor holds, of any workspaces; the control plane
answers each at its place in the beat: renewed, lost (no longer held at that epoch) or
failed at a limit, and asks again for a paused run to be handed back.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import grpc

from agentrun.v1 import executor_pb2
from control_plane.server import RunningServer
from control_plane.store import lease, runs
from tests import factories
from tests.harness import auth

CONNECT = "/agentrun.v1.ExecutorService/Connect"
EXECUTOR = "ex-beat"


def _frame(**msg: Any) -> bytes:
    return executor_pb2.ConnectRequest(**msg).SerializeToString()


async def _next(stream: Any, field: str) -> Any:
    while True:
        msg = await stream.read()
        assert msg is not grpc.aio.EOF, f"the stream ended before a {field}"
        if msg.HasField(field):
            return getattr(msg, field)


async def test_a_beat_is_answered_lease_by_lease_in_the_order_sent(
    server: RunningServer, db_url: str
) -> None:
    pool = server.pool
    key = await auth.executor_key(db_url)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stream = channel.stream_stream(CONNECT, None, executor_pb2.ConnectResponse.FromString)(
            timeout=30, metadata=(("authorization", f"Bearer {key}"),)
        )
        await stream.write(_frame(hello=executor_pb2.Hello(executor_id=EXECUTOR, capacity=1)))
        await _next(stream, "welcome")
        # Held by this executor (claimed after its Hello, which lets go of what it does not
        # name): two runs of ws-a, one with a minute's deadline, and two of ws-b.
        await factories.queued_runs(pool, 1, workspace_id="ws-a")
        await factories.queued_runs(
            pool, 1, workspace_id="ws-a", agent_id="short", deadline_seconds=60
        )
        await factories.queued_runs(pool, 2, workspace_id="ws-b")
        held = await lease.claim_due(pool, [EXECUTOR] * 4, 30)
        by = {(h.workspace_id, h.agent_id): h for h in held}
        ws_b = sorted((h for h in held if h.workspace_id == "ws-b"), key=lambda h: h.run_id)
        ok_a, short, ok_b, stale = by["ws-a", "agent"], by["ws-a", "short"], ws_b[0], ws_b[1]
        await pool.execute("UPDATE runs SET active_seconds = 61 WHERE run_id = $1", short.run_id)
        await pool.execute("UPDATE runs SET paused = true WHERE run_id = $1", ok_b.run_id)

        def sent(run: runs.Run, epoch: int | None = None) -> executor_pb2.Lease:
            return executor_pb2.Lease(
                workspace_id=run.workspace_id,
                run_id=str(run.run_id),
                epoch=run.lease_epoch if epoch is None else epoch,
            )

        beat = [sent(ok_a), sent(stale, stale.lease_epoch - 1), sent(short), sent(ok_b)]
        await stream.write(_frame(heartbeat=executor_pb2.Heartbeat(request_id=9, leases=beat)))
        result = await _next(stream, "heartbeat_result")
        assert (result.request_id, result.checked) == (9, True)
        assert [(s.lease, s.renewed, s.reason) for s in result.leases] == [
            (beat[0], True, ""),
            (beat[1], False, "lost"),
            (beat[2], False, "deadline"),
            (beat[3], True, ""),
        ]
        # The paused run, renewed and now held by this stream, is asked to be handed back.
        cancel = await _next(stream, "cancel")
        assert (cancel.lease, cancel.pause) == (beat[3], True)
        stream.cancel()
    for run, renewed in ((ok_a, True), (ok_b, True), (stale, False)):
        row = await runs.get_run(pool, run.workspace_id, run.run_id)
        assert row.status == "running"
        assert (row.wake_at > run.wake_at + timedelta(microseconds=1)) is renewed
    failed = await runs.get_run(pool, "ws-a", short.run_id)
    assert (failed.status, failed.error) == ("failed", "deadline exceeded")
