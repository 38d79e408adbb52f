"""Child runs with real processes: a parent starts three children through `start_child`;
each child's outcome reaches the parent's log exactly once, through kill -9 of the parent's
executor right after it started a child and of a child's executor mid-run."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from agentrun.v1 import run_pb2
from tests.harness.agentrun_api import Api, sandbox_requests
from tests.harness.invariants import assert_log_well_formed, assert_no_reask
from tests.harness.waiting import eventually


@pytest.fixture
async def stack(db_url, control_plane, sandbox_model, sandbox_providers):
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url)
    await api.publish("kid", "echo_input", ["echo"])
    await api.publish("parent", "parent3", ["start_child"])
    yield cp, api
    await api.close()


async def children_of(db_url: str, run_id: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(db_url)
    try:
        return await conn.fetch(
            "SELECT run_id, parent_seq, input, status, output, priority FROM runs"
            " WHERE workspace_id = 'ws' AND parent_run_id = $1 ORDER BY parent_seq",
            uuid.UUID(run_id),
        )
    finally:
        await conn.close()


async def check_family(api: Api, db_url: str, parent_id: str, model_url: str) -> None:
    """Three children admitted, each ended once, each outcome in the parent's log once."""
    (parent,) = await api.wait_terminal([parent_id], within=120)
    assert parent.status == run_pb2.RUN_STATUS_COMPLETED, parent.error
    kids = await children_of(db_url, parent_id)
    assert [k["input"] for k in kids] == ["one", "two", "three"]
    assert all(k["status"] == "completed" for k in kids)
    steps = await api.steps(parent_id)
    assert_log_well_formed(steps)
    model_log = sandbox_requests(model_url)
    assert_no_reask(parent_id, steps, model_log)
    started = [s for s in steps if s.kind == "tool_started" and s.payload["tool"] == "start_child"]
    results = [s for s in steps if s.kind == "tool_result" and s.payload["tool"] == "start_child"]
    assert len(started) == 3
    assert sorted(r.ref_seq for r in results) == [s.seq for s in started]
    assert [k["parent_seq"] for k in kids] == [s.seq for s in started]
    for kid, result in zip(kids, sorted(results, key=lambda r: r.ref_seq), strict=True):
        assert result.payload["status"] == "ok"
        assert result.payload["output"]["child_run_id"] == str(kid["run_id"])
        assert result.payload["output"]["output"] == kid["output"]
        # Visible from the child too: GetRun names its parent and the call.
        kid_run = await api.get(str(kid["run_id"]))
        assert (kid_run.parent_run_id, kid_run.parent_seq) == (parent_id, result.ref_seq)
        kid_steps = await api.steps(str(kid["run_id"]))
        assert_log_well_formed(kid_steps)
        assert_no_reask(str(kid["run_id"]), kid_steps, model_log)
    # The model was asked once per decision of the parent (three calls and the answer).
    decisions = [s for s in steps if s.kind == "model_decision"]
    assert len(decisions) == 4
    assert "Children done" in parent.output


async def test_three_children_each_reach_the_parent_once(
    stack, executor_factory, db_url, sandbox_model
):
    cp, api = stack
    # A child runs at its parent's priority (start_child names none of its own).
    start = run_pb2.StartRunRequest(workspace_id=api.ws, agent_id="parent", input="go", priority=12)
    parent_id = (await api.runs.StartRun(start)).run.run_id
    executor_factory(cp)
    await check_family(api, db_url, parent_id, sandbox_model.url)
    assert [k["priority"] for k in await children_of(db_url, parent_id)] == [12, 12, 12]


async def test_a_missing_agent_is_the_calls_error_and_the_parent_goes_on(
    stack, executor_factory, db_url
):
    cp, api = stack
    # Workspace ws2 has no agent `kid`: each call's result says so, and nothing is admitted.
    api2 = await Api.connect(cp.address, db_url, workspace="ws2")
    try:
        await api2.publish("parent", "parent3", ["start_child"])
        parent_id = await api2.start("parent", "go")
        executor_factory(cp)
        (parent,) = await api2.wait_terminal([parent_id], within=60)
        assert parent.status == run_pb2.RUN_STATUS_COMPLETED, parent.error
        results = [
            s
            for s in await api2.steps(parent_id)
            if s.kind == "tool_result" and s.payload["tool"] == "start_child"
        ]
        assert len(results) == 3
        assert all(r.payload["status"] == "error" for r in results)
        assert "no published version" in results[0].payload["error"]
    finally:
        await api2.close()


async def test_kill_9_of_the_parents_and_a_childs_executor_loses_and_repeats_nothing(
    stack, executor_factory, db_url, sandbox_model
):
    cp, api = stack
    parent_id = await api.start("parent", "go")
    # The parent's executor dies right after its second start_child commit landed...
    (parents,) = executor_factory(cp, AGENTRUN_FAULTS="executor.child.after_start_commit=kill@2")
    await eventually(lambda: not parents.alive, timeout=60, message="parent fault never fired")
    assert parents.returncode == -9
    # ...and a child's executor dies after its echo answered, before recording it.
    (kids,) = executor_factory(cp, AGENTRUN_FAULTS="executor.tool.after_response=kill@1")
    await eventually(lambda: not kids.alive, timeout=60, message="child fault never fired")
    assert kids.returncode == -9
    executor_factory(cp)
    await check_family(api, db_url, parent_id, sandbox_model.url)
