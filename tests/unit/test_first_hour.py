"""The first hour of a new user (issue 47): `make run` installs the runtime only; which model
`agentrun dev` gives its agents when a provider key is in the environment; the sandbox's
scenario directories and `{{instructions}}`; `apply` does not republish a spec the server
only filled defaults into."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest

from agentrun.v1 import agent_pb2, approval_pb2
from agentrun_cli import agent_files
from agentrun_cli.stack import OPENAI_URL, real_model, sandbox_profiles
from executor.config import ExecutorConfig
from sandbox.scenario import DEFAULT_DIR, ScenarioStore, render_turn

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-test-secret-value"


def _make(target: str, venv: Path) -> str:
    done = subprocess.run(
        ["make", "-n", target, f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_make_run_installs_the_runtime_only_and_make_test_adds_the_dev_tools(tmp_path):
    run = _make("run", tmp_path / "venv")
    assert "pip install -q --disable-pip-version-check --no-compile -e . " in run
    assert ".[dev]" not in run and "agentrun dev --demo" in run
    test = _make("test", tmp_path / "venv")
    # From nothing: the runtime first, then the dev extra, then pytest.
    assert test.index("-e . ") < test.index("-e '.[dev]'") < test.index("-m pytest")
    for target in ("lint", "gen", "bench"):
        assert "-e '.[dev]'" in _make(target, tmp_path / "venv"), target


def test_runtime_dependencies_hold_no_test_lint_or_codegen_tool():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {d.split("==")[0].split("[")[0] for d in project["dependencies"]}
    tools = {"pytest", "hypothesis", "playwright", "mypy", "ruff", "grpcio-tools", "buf-bin"}
    assert runtime & tools == set()


def test_no_provider_in_the_environment_leaves_the_agents_to_the_sandbox():
    assert real_model({}) is None


def test_an_openai_key_makes_openai_the_profile_of_agents_naming_none():
    real = real_model({"OPENAI_API_KEY": KEY})
    assert real is not None and real.default_profile == "openai" and not real.base_url
    assert real.profiles["openai"] == {
        "provider": "openai",
        "base_url": OPENAI_URL,
        "api_key_env": "OPENAI_API_KEY",
    }
    assert KEY not in repr(real) + real.describe()  # the key stays in the environment


def test_anthropic_alone_is_the_default_and_with_openai_both_are_profiles():
    alone = real_model({"ANTHROPIC_API_KEY": KEY})
    assert alone is not None and alone.default_profile == "anthropic"
    both = real_model({"ANTHROPIC_API_KEY": KEY, "OPENAI_API_KEY": KEY})
    assert both is not None and both.default_profile == "openai"
    assert set(both.profiles) == {"openai", "anthropic"}


def test_a_base_url_serves_agents_naming_no_profile_through_the_default_endpoint():
    real = real_model({"AGENTRUN_MODEL_BASE_URL": "http://127.0.0.1:11434/v1"})
    assert real is not None and real.base_url == "http://127.0.0.1:11434/v1"
    assert real.default_profile == "" and "AGENTRUN_MODEL_BASE_URL" in real.describe()


def test_the_executor_reads_what_the_dev_stack_gives_it():
    real = real_model({"OPENAI_API_KEY": KEY, "ANTHROPIC_API_KEY": KEY})
    assert real is not None
    profiles = {**json.loads(sandbox_profiles("http://127.0.0.1:1/v1")), **real.profiles}
    env = {
        "AGENTRUN_MODEL_PROFILES": json.dumps(profiles),
        "AGENTRUN_MODEL_DEFAULT_PROFILE": real.default_profile,
        "OPENAI_API_KEY": KEY,
        "ANTHROPIC_API_KEY": KEY,
    }
    config = ExecutorConfig.from_env(env)
    assert config.model_default_profile == "openai"
    assert config.model_profiles["openai"].api_key == KEY
    assert KEY not in repr(config)


def test_a_default_profile_that_is_not_defined_stops_the_executor_naming_it():
    with pytest.raises(ValueError, match=r"AGENTRUN_MODEL_DEFAULT_PROFILE names 'gpt'.*none"):
        ExecutorConfig.from_env({"AGENTRUN_MODEL_DEFAULT_PROFILE": "gpt"})


def test_the_users_scenarios_come_first_and_the_built_in_ones_stay(tmp_path):
    (tmp_path / "demo.json").write_text(json.dumps({"turns": [{"content": "mine"}]}))
    (tmp_path / "weather.json").write_text(json.dumps({"turns": [{"content": "sunny"}]}))
    store = ScenarioStore([tmp_path, DEFAULT_DIR])
    assert store.get("demo").turns[0]["content"] == "mine"
    assert store.get("weather").turns[0]["content"] == "sunny"
    assert store.get("echo_input").name == "echo_input"  # a built-in one
    assert {"demo", "weather", "echo_input"} <= set(store.names())


def test_instructions_fill_a_scenario_turn():
    messages = [{"role": "system", "content": "Weather report:"}, {"role": "user", "content": "?"}]
    reply = render_turn({"content": "{{instructions}} {{input}}"}, messages, random.Random(0))
    assert reply.content == "Weather report: ?"


def test_a_spec_the_server_filled_defaults_into_is_the_same_spec():
    from_file = agent_pb2.AgentSpec(model="weather", tools=["weather"])
    stored = agent_pb2.AgentSpec(model="weather", tools=["weather"])
    stored.limits.deadline.SetInParent()
    stored.approval.on_expiry = approval_pb2.EXPIRY_ACTION_REJECT
    assert agent_files.same_spec(stored, from_file)
    stored.limits.max_steps = 3
    assert not agent_files.same_spec(stored, from_file)
    escalate = agent_pb2.AgentSpec(model="weather", tools=["weather"])
    escalate.approval.on_expiry = approval_pb2.EXPIRY_ACTION_ESCALATE
    assert not agent_files.same_spec(escalate, from_file)
