"""Model outages are waits: runs park `waiting_model` with backoff and fail only past their budget.

Real control plane, executors and model sandbox. The outage lasts
AGENTRUN_TEST_MODEL_OUTAGE_SECONDS (30 by default, as the issue asks; set it lower for a
quick run); the executors cap their backoff at 2 s so the runs notice the end of it soon.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from agentrun.v1 import run_pb2
from tests.harness.agentrun_api import Api, clear_faults, sandbox_requests, set_fault
from tests.harness.invariants import assert_log_well_formed, assert_no_reask
from tests.harness.waiting import eventually

OUTAGE_SECONDS = float(os.environ.get("AGENTRUN_TEST_MODEL_OUTAGE_SECONDS", "30"))
LIVE = {run_pb2.RUN_STATUS_QUEUED, run_pb2.RUN_STATUS_RUNNING, run_pb2.RUN_STATUS_WAITING}

DECIDED = """
SELECT count(DISTINCT run_id) FROM steps
WHERE run_id = ANY($1::uuid[]) AND kind = 'model_decision'
"""


@pytest.fixture
async def stack(db_url, control_plane, sandbox_model):
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url)
    yield cp, api
    await api.close()
    clear_faults(sandbox_model.url)


async def model_parks(api: Api, run_id: str) -> list[dict]:
    steps = await api.steps(run_id)
    return [s.payload for s in steps if s.kind == "park" and s.payload["wait_reason"] == "model"]


async def test_runs_wait_out_a_model_outage_and_finish_without_reasking(
    stack, db, executor_factory, sandbox_model
):
    cp, api = stack
    await api.publish("sleeper", "sleepy", ["sleep", "echo"], model_retry_budget=100)
    executor_factory(cp, count=2, AGENTRUN_MODEL_BACKOFF_CAP_SECONDS="2")
    run_ids = [await api.start("sleeper") for _ in range(6)]

    # Every run has a committed decision (a 2 s sleep) when the model goes down.
    async def all_decided() -> bool:
        return await db.fetchval(DECIDED, run_ids) == len(run_ids)

    await eventually(all_decided, timeout=20, message="runs did not decide before the outage")
    set_fault(sandbox_model.url, down=True, status=503)
    began = time.monotonic()
    try:
        waiting = await eventually(
            lambda: _parked_on_model(api, run_ids[0]), timeout=15, message="no waiting_model"
        )
        assert waiting.queue.cause == run_pb2.QUEUE_WAIT_CAUSE_MODEL_UNAVAILABLE
        await asyncio.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - began)))  # the outage
        during = [await api.get(r) for r in run_ids]
        assert {r.status for r in during} <= LIVE, [r.error for r in during]
    finally:
        clear_faults(sandbox_model.url)

    runs = await api.wait_terminal(run_ids, within=30)
    assert {r.status for r in runs} == {run_pb2.RUN_STATUS_COMPLETED}, [r.error for r in runs]
    model_log = sandbox_requests(sandbox_model.url)
    for run_id in run_ids:
        steps = await api.steps(run_id)
        assert_log_well_formed(steps)
        assert_no_reask(run_id, steps, model_log)
        assert len(await model_parks(api, run_id)) >= 2, "the run did not wait out the outage"


async def _parked_on_model(api: Api, run_id: str) -> run_pb2.Run | None:
    run = await api.get(run_id)
    waiting = run.status == run_pb2.RUN_STATUS_WAITING and run.wait_reason == "model"
    return run if waiting and run.HasField("queue") else None


async def test_past_its_retry_budget_a_run_fails_with_a_clear_reason(
    stack, executor_factory, sandbox_model
):
    cp, api = stack
    await api.publish("fragile", "echo_input", ["echo"], model_retry_budget=2)
    set_fault(sandbox_model.url, down=True, status=503)
    executor_factory(cp, AGENTRUN_MODEL_BACKOFF_CAP_SECONDS="0.3")
    run_id = await api.start("fragile")
    (run,) = await api.wait_terminal([run_id], within=20)
    assert run.status == run_pb2.RUN_STATUS_FAILED
    assert run.error == (
        "model unavailable after 3 attempts (model_retry_budget 2): model provider returned "
        "503 server_error: sandbox fault: model server is down (503)"
    )
    assert len(await model_parks(api, run_id)) == 2
