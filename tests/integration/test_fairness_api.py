"""Caps and queue positions through the public API of a real control plane."""

from __future__ import annotations

import asyncpg
import grpc
import pytest
from google.protobuf import duration_pb2

from agentrun.v1 import agent_pb2, run_pb2
from control_plane.store import lease, workspaces
from tests.harness.agentrun_api import Api


@pytest.fixture
async def stack(db_url, control_plane):
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url)
    pool = await asyncpg.create_pool(db_url, min_size=1, max_size=2)
    yield api, pool
    await pool.close()
    await api.close()


async def publish(api: Api, agent_id: str, **spec) -> agent_pb2.AgentVersion:
    await api.agents.CreateAgent(agent_pb2.CreateAgentRequest(workspace_id="ws", agent_id=agent_id))
    request = agent_pb2.PublishAgentVersionRequest(
        workspace_id="ws", agent_id=agent_id, spec=agent_pb2.AgentSpec(model="writer", **spec)
    )
    return (await api.agents.PublishAgentVersion(request)).version


async def test_get_run_says_how_many_runs_are_ahead_and_which_cap_holds_it(stack):
    api, pool = stack
    await publish(api, "importer")
    await workspaces.set_plan(pool, "ws", "free")  # two at once
    run_ids = [await api.start("importer") for _ in range(5)]
    first = (await api.get(run_ids[0])).queue
    assert (first.runs_ahead, first.cause) == (0, run_pb2.QUEUE_WAIT_CAUSE_TURN)

    # Two are claimed (as an executor would): the workspace is at its cap.
    await lease.claim_due(pool, ["ex", "ex"], 60)
    waiting = [await api.get(r) for r in run_ids]
    queued = [r for r in waiting if r.status == run_pb2.RUN_STATUS_QUEUED]
    assert [r.queue.runs_ahead for r in queued] == [0, 1, 2]
    assert {r.queue.cause for r in queued} == {run_pb2.QUEUE_WAIT_CAUSE_WORKSPACE_CAP}
    assert (queued[0].queue.workspace_running, queued[0].queue.workspace_max_concurrency) == (2, 2)
    running = [r for r in waiting if r.status == run_pb2.RUN_STATUS_RUNNING]
    assert len(running) == 2 and not running[0].HasField("queue")


async def test_an_agents_cap_and_retry_budget_come_from_its_spec(stack):
    api, pool = stack
    limits = agent_pb2.RunLimits(model_retry_budget=7, deadline=duration_pb2.Duration(seconds=60))
    version = await publish(api, "careful", max_concurrency=1, limits=limits)
    assert version.spec.max_concurrency == 1 and version.spec.limits.model_retry_budget == 7
    run_ids = [await api.start("careful") for _ in range(3)]
    assert (await api.get(run_ids[0])).limits.model_retry_budget == 7

    assert len(await lease.claim_due(pool, ["ex"] * 3, 60)) == 1
    behind = await api.get(run_ids[2])
    assert behind.queue.cause == run_pb2.QUEUE_WAIT_CAUSE_AGENT_CAP
    assert (behind.queue.agent_running, behind.queue.agent_max_concurrency) == (1, 1)


async def test_a_cap_out_of_range_is_refused_naming_the_field(stack):
    api, _ = stack
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await publish(api, "greedy", max_concurrency=-1)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "spec.max_concurrency" in caught.value.details()
