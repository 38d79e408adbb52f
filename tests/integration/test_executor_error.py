"""A run that an executor fails on, every time, in a way nothing handles (a bug).

A real executor armed to raise right after every model answer (as a bug in reading the
answer would), the sandbox model, a real control plane: the run shows why it waits
(wait_reason "executor_error") while it backs off, is tried five times in all, each after
a longer wait, then fails naming the exception's class and where it was raised. Before,
its lease lapsed and every executor that took it over failed the same way, unseen, until
the run's deadline.
"""

from __future__ import annotations

import pytest

from agentrun.v1 import run_pb2
from executor.run_loop import CRASH_WAIT, MAX_CRASHES
from tests.harness.agentrun_api import echo_stack, sandbox_requests
from tests.harness.waiting import eventually

FAULT = "executor.model.after_response=raise"
BACKOFF = 0.3


@pytest.fixture
async def stack(db_url, control_plane, sandbox_model):
    async with echo_stack(control_plane, db_url) as started:
        yield started


async def test_a_run_the_executor_keeps_failing_on_backs_off_visibly_then_fails(
    stack, executor_factory, sandbox_model
):
    cp, api = stack
    run_id = await api.start("echoer", "hello")
    (executor,) = executor_factory(
        cp, AGENTRUN_FAULTS=FAULT, AGENTRUN_CRASH_BACKOFF_SECONDS=str(BACKOFF)
    )

    async def waiting_on_the_executor() -> bool:
        run = await api.get(run_id)
        return run.status == run_pb2.RUN_STATUS_WAITING and run.wait_reason == CRASH_WAIT

    await eventually(waiting_on_the_executor, timeout=20)
    (run,) = await api.wait_terminal([run_id], within=60)
    assert run.status == run_pb2.RUN_STATUS_FAILED
    assert run.error.startswith(
        f"executor error: the run's task failed {MAX_CRASHES} times, the last with "
        "InjectedFault in point (__init__.py:"
    ), run.error
    steps = await api.steps(run_id)
    parks = [s.payload for s in steps if s.kind == "park"]
    assert [p["wait_reason"] for p in parks] == [CRASH_WAIT] * (MAX_CRASHES - 1)
    assert [p["wake_after_seconds"] for p in parks] == [BACKOFF * 2**i for i in range(4)]
    assert [s.kind for s in steps] == ["input"] + ["park"] * (MAX_CRASHES - 1) + ["finish"]
    assert steps[-1].payload == {"status": "failed", "error": run.error}
    # One model call a try, each by a fresh claim of the run: never a lapsed lease.
    asked = [r for r in sandbox_requests(sandbox_model.url) if r.get("run_id") == run_id]
    assert len(asked) == MAX_CRASHES
    assert run.lease_epoch == MAX_CRASHES and run.attempt == 0
    assert executor.log_path.read_text().count("its task failed") == MAX_CRASHES
