"""A claimed run whose Assignment cannot be built is settled alone; the runs claimed with it
are delivered.

A real control plane whose dispatcher fails to build an Assignment from the second on (as a
bug, or data no check foresaw, would), a real executor and the sandbox model. Three runs are
queued before the executor connects, so one claim takes them together. Before, the one
failure threw the whole claim's delivery away: all three stayed leased to a stream that never
got them, lapsed, were claimed together again and failed again, every lease period.
"""

from __future__ import annotations

import re

import pytest

from agentrun.v1 import run_pb2
from tests.harness.agentrun_api import echo_stack, sandbox_requests

FAULT = "control_plane.dispatch.assignment=raise@2"
REASON = r"internal error while building the run's assignment \(request ([0-9a-f]{12})\)"


# The n-th assignment fails on purpose: with the gate on, the self-check canary's runs would
# take the first ones (and fail, closing the release). This test is about one claim's
# delivery: gate off.
@pytest.fixture
async def stack(db_url, control_plane, sandbox_model):
    async with echo_stack(
        control_plane, db_url, AGENTRUN_FAULTS=FAULT, AGENTRUN_RELEASE_GATE="off"
    ) as started:
        yield started


async def test_a_run_that_cannot_be_assigned_fails_alone_and_the_others_are_delivered(
    stack, executor_factory, sandbox_model
):
    cp, api = stack
    run_ids = [await api.start("echoer", f"hello {i}") for i in range(3)]
    (executor,) = executor_factory(cp, AGENTRUN_CAPACITY="3")
    runs = await api.wait_terminal(run_ids, within=30)
    (done,) = [r for r in runs if r.status == run_pb2.RUN_STATUS_COMPLETED]
    failed = [r for r in runs if r.status == run_pb2.RUN_STATUS_FAILED]
    assert len(failed) == 2, [(r.run_id, r.status, r.error) for r in runs]
    cp_log = cp.process.log_path.read_text()
    for run in failed:
        m = re.fullmatch(REASON, run.error)
        assert m, run.error
        assert "fault point" not in run.error  # the error itself stays in the log
        assert f"failing the run (request {m.group(1)})" in cp_log
        steps = await api.steps(run.run_id)
        assert [s.kind for s in steps] == ["input", "finish"]
        assert steps[-1].payload == {"status": "failed", "error": run.error}
    # One claim, never a lapsed lease: the delivered run was not held up by the others.
    assert {r.lease_epoch for r in runs} == {1} and {r.attempt for r in runs} == {0}
    assert executor.log_path.read_text().count("claimed run ") == 1
    asked = {r.get("run_id") for r in sandbox_requests(sandbox_model.url)}
    assert done.run_id in asked and not asked & {r.run_id for r in failed}
