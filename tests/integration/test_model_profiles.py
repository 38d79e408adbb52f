"""Model profiles end to end: two agents on two provider APIs in one stack.

Real control plane, one executor process configured with the dev stack's two
profiles (agentrun_cli/stack.py, AGENTRUN_MODEL_PROFILES) against the one sandbox model server, which speaks
both OpenAI chat completions and the Anthropic Messages API. Each run's
decisions record the five usage keys the control plane prices; a reply that
is no answer, an exhausted quota and an unknown profile each end their run
with a reason instead of completing it or parking it forever.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2

from agentrun.v1 import agent_pb2, run_pb2
from agentrun_cli.stack import sandbox_profiles
from tests.harness.agentrun_api import Api, sandbox_requests

USAGE_KEYS = {
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "reasoning_tokens",
    "cache_write_tokens",
}


@pytest.fixture
async def stack(db_url, control_plane, executor_factory, sandbox_model):
    cp = control_plane(db_url)
    executor_factory(
        # The profiles `agentrun dev` gives its executor: one per API, both on the sandbox.
        cp,
        AGENTRUN_MODEL_PROFILES=sandbox_profiles(f"{sandbox_model.url}/v1"),
        AGENTRUN_MODEL_BACKOFF_CAP_SECONDS="0.5",
    )
    api = await Api.connect(cp.address, db_url)
    yield api
    await api.close()


async def publish(
    api: Api,
    agent_id: str,
    model: str,
    profile: str = "",
    tools: tuple[str, ...] = ("echo",),
    retry_budget: int = 0,
    **parameters: Any,
) -> agent_pb2.AgentVersion:
    await api.agents.CreateAgent(
        agent_pb2.CreateAgentRequest(workspace_id=api.ws, agent_id=agent_id)
    )
    spec = agent_pb2.AgentSpec(
        model=model,
        instructions=f"agent {agent_id}",
        tools=list(tools),
        model_profile=profile,
        model_parameters=agent_pb2.ModelParameters(**parameters) if parameters else None,
        limits=agent_pb2.RunLimits(model_retry_budget=retry_budget),
    )
    resp = await api.agents.PublishAgentVersion(
        agent_pb2.PublishAgentVersionRequest(workspace_id=api.ws, agent_id=agent_id, spec=spec)
    )
    return resp.version


async def decisions(api: Api, run_id: str) -> list[dict[str, Any]]:
    return [s.payload for s in await api.steps(run_id) if s.kind == "model_decision"]


async def test_one_agent_on_each_api_completes_in_the_same_stack(stack, sandbox_model):
    api = stack
    await publish(api, "on-openai", "reasoner", "sandbox-openai", temperature=0.2)
    await publish(
        api,
        "on-anthropic",
        "reasoner",
        "sandbox-anthropic",
        max_tokens=333,
        tool_choice="auto",
        parallel_tool_calls=False,
    )
    runs = {name: await api.start(name, "ping") for name in ("on-openai", "on-anthropic")}
    for run in await api.wait_terminal(list(runs.values()), within=30):
        assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
        assert run.output.startswith("Echoed: ") and "ping" in run.output
    log = sandbox_requests(sandbox_model.url)
    seen = {name: [e for e in log if e["run_id"] == run_id] for name, run_id in runs.items()}
    assert [e["api"] for e in seen["on-openai"]] == ["openai", "openai"]
    assert [e["api"] for e in seen["on-anthropic"]] == ["anthropic", "anthropic"]
    # The version's parameters, and each profile's way of naming the output limit.
    assert seen["on-openai"][0]["params"] == {"temperature": 0.2}
    assert seen["on-anthropic"][0]["params"] == {
        "max_tokens": 333,
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
    }
    openai = await decisions(api, runs["on-openai"])
    anthropic = await decisions(api, runs["on-anthropic"])
    for decision in openai + anthropic:
        assert set(decision["usage"]) == USAGE_KEYS
        assert decision["usage"]["prompt_tokens"] > 0
    assert [d["usage"]["reasoning_tokens"] for d in openai] == [48, 16]
    assert [d["stop_reason"] for d in openai] == ["tool_calls", "stop"]
    assert [d["stop_reason"] for d in anthropic] == ["tool_use", "end_turn"]
    # cache_control on the prefix: the second call reads what the first one wrote.
    assert anthropic[0]["usage"]["cache_write_tokens"] > 0
    assert anthropic[1]["usage"]["cached_tokens"] >= anthropic[0]["usage"]["cache_write_tokens"]


async def test_replies_that_are_no_answer_fail_their_runs(stack):
    api = stack
    await publish(api, "cut-anthropic", "cut_off", "sandbox-anthropic", max_tokens=20)
    await publish(api, "refused-openai", "refuses", "sandbox-openai")
    await publish(api, "quota-openai", "out_of_quota", "sandbox-openai", retry_budget=5)
    await publish(api, "nowhere", "demo", "no-such-profile", retry_budget=1)
    names = ("cut-anthropic", "refused-openai", "quota-openai", "nowhere")
    runs = {name: await api.start(name) for name in names}
    done = dict(zip(names, await api.wait_terminal(list(runs.values()), within=30), strict=True))
    assert all(run.status == run_pb2.RUN_STATUS_FAILED for run in done.values())
    assert done["cut-anthropic"].error == (
        "model reply cut off at max_tokens 20 (stop reason max_tokens): not a complete answer"
    )
    [cut] = await decisions(api, runs["cut-anthropic"])
    assert cut["ending"] == "truncated" and cut["tool_calls"] == []
    assert cut["content"].startswith("The quarterly figures")  # recorded, and its tokens counted
    assert set(cut["usage"]) == USAGE_KEYS and cut["usage"]["completion_tokens"] > 0
    assert done["refused-openai"].error == ("the model refused: I can't help with that request.")
    # An exhausted quota fails at once: no park spends the retry budget on it.
    assert "quota or credit exhausted (429 insufficient_quota)" in done["quota-openai"].error
    steps = await api.steps(runs["quota-openai"])
    assert [s.kind for s in steps] == ["input", "finish"]
    assert "'no-such-profile' is not configured on this executor" in done["nowhere"].error


async def test_profile_and_parameters_are_validated_and_kept(stack):
    api = stack
    version = await publish(
        api,
        "kept",
        "",
        "sandbox-anthropic",
        max_tokens=100,
        temperature=0.0,
        tool_choice="echo",
        parallel_tool_calls=True,
        timeout=duration_pb2.Duration(seconds=9),
    )
    got = await api.agents.GetAgentVersion(
        agent_pb2.GetAgentVersionRequest(workspace_id=api.ws, agent_id="kept")
    )
    assert got.version.spec.model_profile == "sandbox-anthropic" == version.spec.model_profile
    params = got.version.spec.model_parameters
    assert (params.max_tokens, params.tool_choice, params.timeout.seconds) == (100, "echo", 9)
    assert params.HasField("temperature") and params.temperature == 0.0
    assert params.HasField("parallel_tool_calls") and params.parallel_tool_calls
    bad = {
        "spec.model_parameters.tool_choice": {"tool_choice": "send_email"},
        "spec.model_parameters.temperature": {"temperature": 2.5},
        "spec.model_parameters.max_tokens": {"max_tokens": -1},
        "spec.model_parameters.timeout": {"timeout": duration_pb2.Duration(seconds=7200)},
    }
    for index, (field, parameters) in enumerate(bad.items()):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await publish(api, f"bad-{index}", "demo", "sandbox-openai", **parameters)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in (err.value.details() or "")
    for index, (field, profile, model) in enumerate(
        (("spec.model_profile", "Not A Slug", "demo"), ("spec.model", "", ""))
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await publish(api, f"worse-{index}", model, profile)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in (err.value.details() or "")
