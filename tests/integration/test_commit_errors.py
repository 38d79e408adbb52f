"""An unexpected error inside the commit transaction fails the run, visibly and once.

A real control plane whose commit transaction raises at a fault point (as a
CHECK violation or a bug would), a real executor and the sandbox model: the
run fails with a reason that carries a request id, the model is asked once,
and nothing loops.
"""

from __future__ import annotations

import re

import pytest

from agentrun.v1 import run_pb2
from tests.harness.agentrun_api import echo_stack, sandbox_requests
from tests.harness.waiting import eventually

FAULT = "control_plane.commit.in_transaction=raise"


# Every commit fails on purpose: the self-check canary would fail too and (rightly) keep the
# release from new runs. This test is about what a failing commit does to a run: gate off.
@pytest.fixture
async def stack(db_url, control_plane, sandbox_model):
    async with echo_stack(
        control_plane, db_url, AGENTRUN_FAULTS=FAULT, AGENTRUN_RELEASE_GATE="off"
    ) as started:
        yield started


async def test_an_error_inside_the_commit_fails_the_run_after_bounded_tries(
    stack, executor_factory, sandbox_model
):
    cp, api = stack
    run_id = await api.start("echoer", "hello")
    (executor,) = executor_factory(cp)
    (run,) = await api.wait_terminal([run_id], within=30)
    assert run.status == run_pb2.RUN_STATUS_FAILED
    assert re.fullmatch(
        r"internal error while committing a step \(request [0-9a-f]{12}\)", run.error
    ), run.error
    assert "fault point" not in run.error  # internals stay in the log
    steps = await api.steps(run_id)
    assert [s.kind for s in steps] == ["input", "finish"]  # the failed commit wrote nothing
    assert steps[-1].payload == {"status": "failed", "error": run.error}
    assert run.counters.steps == len(steps)

    asked = [r for r in sandbox_requests(sandbox_model.url) if r.get("run_id") == run_id]
    assert len(asked) == 1, f"the model was asked {len(asked)} times"
    # Tried three times in the control plane, then failed; the executor stopped.
    tries = cp.process.log_path.read_text().count(
        "fault point control_plane.commit.in_transaction: raising"
    )
    assert tries == 3
    await eventually(lambda: "released: fenced" in executor.log_path.read_text(), timeout=10)
    assert (await api.get(run_id)).lease_epoch == 1
    assert cp.process.log_path.read_text().count("Traceback") == 1
