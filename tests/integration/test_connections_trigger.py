"""The triggering account, with real processes: an agent version maps a provider to the
sentinel `trigger`; each run's tool call acts as the connection its event came in through
(StartRun's trigger_connection_id, recorded in the input step), and a run that came in
through none gets the call's error result with nothing sent."""

from __future__ import annotations

import json
import uuid

import grpc
import pytest

from agentrun.v1 import agent_pb2, run_pb2
from tests.harness.agentrun_api import Api
from tests.harness.auth import workspace_key
from tests.integration.test_connections_runs import WS, connect, mine
from tests.integration.test_signals import cli

AGENT = "poster-trigger"


@pytest.fixture
async def stack(db_url, control_plane):
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url, WS)
    await api.agents.CreateAgent(agent_pb2.CreateAgentRequest(workspace_id=WS, agent_id=AGENT))
    spec = agent_pb2.AgentSpec(
        model="poster", instructions="post", tools=["chat_post"], connections={"chat": "trigger"}
    )
    await api.agents.PublishAgentVersion(
        agent_pb2.PublishAgentVersionRequest(workspace_id=WS, agent_id=AGENT, spec=spec)
    )
    yield cp, api
    await api.close()


async def start(api: Api, connection_id: str = "") -> str:
    resp = await api.runs.StartRun(
        run_pb2.StartRunRequest(
            workspace_id=WS,
            agent_id=AGENT,
            input="post the update",
            trigger_connection_id=connection_id,
        )
    )
    return resp.run.run_id


async def test_each_run_acts_as_the_account_it_came_in_through(
    stack, db_url, executor_factory, sandbox_providers
):
    cp, api = stack
    accounts = [f"{who}-{uuid.uuid4().hex[:6]}@acme" for who in ("ada", "bob")]
    cids = [await connect(cp, db_url, account) for account in accounts]
    # One through the API, one through `agentrun runs start --trigger-connection`.
    key = await workspace_key(db_url, WS, role="operator")
    done = await cli(
        cp.address,
        key,
        "runs",
        "start",
        AGENT,
        "--input",
        "post the update",
        "--trigger-connection",
        cids[1],
        "--json",
    )
    assert done.returncode == 0, done.stderr
    came_in = [await start(api, cids[0]), json.loads(done.stdout)["run"]["run_id"]]
    through_none = await start(api)
    executor_factory(cp)
    finished = await api.wait_terminal([*came_in, through_none], within=60)
    assert all(r.status == run_pb2.RUN_STATUS_COMPLETED for r in finished), [
        r.error for r in finished
    ]
    for run_id, account in zip(came_in, accounts, strict=True):
        (sent,) = mine(sandbox_providers.url, [run_id])
        assert (sent["account"], sent["status"]) == (account, 200)
        (step,) = [s for s in await api.steps(run_id) if s.seq == 0]
        assert step.payload["trigger_connection_id"] in cids
    # No triggering connection: the call's error result, and nothing reached the provider.
    assert mine(sandbox_providers.url, [through_none]) == []
    steps = await api.steps(through_none)
    assert not [s for s in steps if s.kind == "tool_started"]
    (result,) = [s for s in steps if s.kind == "tool_result"]
    assert result.payload["status"] == "error"
    assert "triggering account" in result.payload["error"]
    assert "nothing was sent" in result.payload["error"]


async def test_a_triggering_connection_must_be_one_of_the_workspace(stack, db_url):
    cp, api = stack
    for value in ("not-a-uuid", str(uuid.uuid4())):
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await start(api, value)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "trigger_connection_id" in (bad.value.details() or "")
    # Another workspace's connection is no connection of this one.
    other = await Api.connect(cp.address, db_url, "ws-other")
    try:
        await other.publish(AGENT, "poster", ["chat_post"])
        theirs = await connect(cp, db_url, f"eve-{uuid.uuid4().hex[:6]}@acme")
        with pytest.raises(grpc.aio.AioRpcError) as foreign:
            await other.runs.StartRun(
                run_pb2.StartRunRequest(
                    workspace_id="ws-other",
                    agent_id=AGENT,
                    input="x",
                    trigger_connection_id=theirs,
                )
            )
        assert foreign.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        await other.close()
    # The sentinel is spelled exactly `trigger`.
    spec = agent_pb2.AgentSpec(
        model="poster", instructions="post", tools=["chat_post"], connections={"chat": "Trigger"}
    )
    with pytest.raises(grpc.aio.AioRpcError) as spelled:
        await api.agents.PublishAgentVersion(
            agent_pb2.PublishAgentVersionRequest(workspace_id=WS, agent_id=AGENT, spec=spec)
        )
    assert spelled.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "spec.connections[chat]" in (spelled.value.details() or "")
    # The CLI publishes the mapping: `--connection chat=trigger`.
    admin = await workspace_key(db_url, WS, role="admin")
    argv = [
        "agents",
        "publish",
        AGENT,
        "--model",
        "poster",
        "--instructions",
        "post",
        "--tool",
        "chat_post",
    ]
    done = await cli(cp.address, admin, *argv, "--connection", "chat=trigger", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["spec"]["connections"] == {"chat": "trigger"}
    wrong = await cli(cp.address, admin, *argv, "--connection", "chat=Trigger")
    assert wrong.returncode != 0 and "INVALID_ARGUMENT" in wrong.stderr
