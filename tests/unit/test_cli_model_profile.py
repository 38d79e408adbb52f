"""`agentrun agents publish` names a model profile and parameters; `agents show` says it."""

from agentrun.v1 import agent_pb2
from agentrun_cli import commands, render
from agentrun_cli.parser import build_parser

BASE = ["agents", "publish", "a1", "--instructions", "hi", "--tool", "echo"]


def test_publish_flags_become_the_specs_profile_and_parameters():
    args = build_parser().parse_args(
        [*BASE, "--model-profile", "claude", "--max-output-tokens", "300", "--temperature", "0"]
    )
    spec = commands._spec(args)
    assert (spec.model, spec.model_profile) == ("", "claude")
    assert spec.model_parameters.max_tokens == 300
    assert spec.model_parameters.HasField("temperature")
    assert spec.model_parameters.temperature == 0.0


def test_without_the_flags_the_spec_has_neither():
    spec = commands._spec(build_parser().parse_args([*BASE, "--model", "demo"]))
    assert spec.model == "demo" and not spec.model_profile
    assert not spec.HasField("model_parameters")


def test_show_names_the_profile():
    agent = agent_pb2.Agent(agent_id="a1", latest_version=1)
    spec = agent_pb2.AgentSpec(model="m", model_profile="claude")
    lines = render.agent_lines(agent, agent_pb2.AgentVersion(version=1, spec=spec))
    assert "model     m (profile claude)" in lines


def test_a_decision_line_shows_cache_and_reasoning_tokens_and_a_failed_ending():
    usage = {
        "prompt_tokens": 100,
        "completion_tokens": 20,
        "cached_tokens": 80,
        "reasoning_tokens": 12,
        "cache_write_tokens": 0,
    }
    assert render._decision({"content": "hi", "usage": usage}) == (
        'says "hi" [100+20 tokens, 80 cached, 12 reasoning]'
    )
    cut = {"content": "The answer", "ending": "truncated", "stop_reason": "length", "usage": {}}
    assert render._decision(cut) == 'says "The answer"; truncated (length) [0+0 tokens]'
