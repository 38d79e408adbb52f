"""SignalRun under kill -9 of the control plane, with real processes: the sender resends the
same event id after the crash; the signal is delivered once whether the crash rolled it back
or only lost the reply."""

from __future__ import annotations

import grpc
import pytest

from agentrun.v1 import run_pb2
from tests.harness.agentrun_api import Api
from tests.harness.waiting import eventually
from tests.integration.test_signals import TOOL, signal, waits


async def waiting_on_first_call(api: Api, run_id: str) -> bool:
    run = await api.get(run_id)
    started, results = waits(await api.steps(run_id))
    return run.wait_reason == "signal" and len(started) == 1 and not results


@pytest.mark.parametrize(
    ("fault", "landed"),
    [("control_plane.signal.before_commit", False), ("control_plane.signal.after_commit", True)],
)
async def test_a_signal_resent_after_a_crash_is_delivered_once(
    db_url, control_plane, executor_factory, sandbox_model, fault, landed
):
    cp = control_plane(db_url, AGENTRUN_FAULTS=f"{fault}=kill")
    api = await Api.connect(cp.address, db_url)
    try:
        await api.publish("waiter", "signal_twice", [TOOL])
        run_id = await api.start("waiter", "go")
        executor_factory(cp)
        await eventually(
            lambda: waiting_on_first_call(api, run_id),
            timeout=30,
            message="the run never waited on its first signal",
        )
        with pytest.raises(grpc.aio.AioRpcError):  # the replica dies inside SignalRun
            await signal(api, run_id, "step", "e1", {"n": 1})
        await eventually(lambda: not cp.process.alive, timeout=10, message="fault never fired")
        cp.restart(AGENTRUN_FAULTS="")
        again = await signal(api, run_id, "step", "e1", {"n": 1})
        # Rolled back: this is the first delivery. Committed: the first one's answer.
        assert again.created is not landed
        assert again.signal.consumed_seq > 0
        await signal(api, run_id, "step", "e2", {"n": 2})
        (run,) = await api.wait_terminal([run_id], within=30)
        assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
        started, results = waits(await api.steps(run_id))
        assert [r.ref_seq for r in results] == [s.seq for s in started]
        assert [r.payload["output"]["event_id"] for r in results] == ["e1", "e2"]
    finally:
        await api.close()
