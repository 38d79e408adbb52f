"""Model profiles (configuration), call settings from a spec, the Anthropic request body,
and Retry-After in its three forms."""

from __future__ import annotations

import email.utils
import json

import pytest
from google.protobuf import duration_pb2
from multidict import CIMultiDict

from agentrun.v1 import agent_pb2
from executor.config import ExecutorConfig
from executor.models import anthropic_messages, profiles
from executor.models.anthropic import AnthropicMessagesModel
from executor.models.base import DEFAULT_SETTINGS, ModelSettings
from executor.retry_after import retry_after

SECRET = "sk-ant-very-secret-key"
PROFILES = {
    "claude": {
        "provider": "anthropic",
        "base_url": "https://api.anthropic.com",
        "model": "claude-sonnet-4-5",
        "api_key_env": "ANTHROPIC_API_KEY",
        "max_tokens": 2048,
        "timeout_seconds": 90,
    },
    "local": {
        "provider": "openai",
        "base_url": "http://127.0.0.1:11434/v1",
        "token_limit_field": "max_completion_tokens",
    },
}


def test_profiles_come_from_inline_json_or_a_file_with_keys_from_the_environment(tmp_path):
    env = {"AGENTRUN_MODEL_PROFILES": json.dumps(PROFILES), "ANTHROPIC_API_KEY": SECRET}
    config = ExecutorConfig.from_env(env)
    claude = config.model_profiles["claude"]
    assert (claude.provider, claude.model, claude.api_key) == (
        "anthropic",
        "claude-sonnet-4-5",
        SECRET,
    )
    assert (claude.max_tokens, claude.timeout_seconds) == (2048, 90.0)
    local = config.model_profiles["local"]
    assert (local.provider, local.api_key, local.token_limit_field) == (
        "openai",
        "",
        "max_completion_tokens",
    )
    assert SECRET not in repr(config)  # the key never reaches a log line through the config
    path = tmp_path / "profiles.json"
    path.write_text(json.dumps(PROFILES))
    from_file = profiles.parse_profiles(str(path), {"ANTHROPIC_API_KEY": SECRET})
    assert from_file == config.model_profiles


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        ({"provider": "gemini", "base_url": "http://x"}, "provider must be one of"),
        ({"provider": "openai", "base_url": "ftp://x"}, "base_url must be an http"),
        ({"provider": "openai", "base_url": "http://x", "api_key": SECRET}, "api_key_env"),
        ({"provider": "openai", "base_url": "http://x", "api_key_env": "UNSET_KEY"}, "UNSET_KEY"),
        ({"provider": "openai", "base_url": "http://x", "max_tokens": 0}, "max_tokens"),
        ({"provider": "openai", "base_url": "http://x", "token_limit_field": "n"}, "token_limit"),
    ],
)
def test_bad_profiles_are_refused_at_startup_naming_the_field(profile, message):
    with pytest.raises(ValueError, match=message) as err:
        profiles.parse_profiles(json.dumps({"p": profile}), {})
    assert SECRET not in str(err.value)


def test_settings_of_a_spec_and_the_default_for_a_spec_without_them():
    assert profiles.settings_of(agent_pb2.AgentSpec(model="m")) == DEFAULT_SETTINGS
    spec = agent_pb2.AgentSpec(
        model="m",
        model_profile="claude",
        model_parameters=agent_pb2.ModelParameters(
            max_tokens=64,
            temperature=0.0,
            tool_choice="required",
            parallel_tool_calls=False,
            timeout=duration_pb2.Duration(seconds=2, nanos=500_000_000),
        ),
    )
    assert profiles.settings_of(spec) == ModelSettings(
        profile="claude",
        max_tokens=64,
        temperature=0.0,
        tool_choice="required",
        parallel_tool_calls=False,
        timeout_seconds=2.5,
    )


CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "look up ada"},
    {
        "role": "assistant",
        "content": "Looking.",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "crm_lookup", "arguments": '{"email": "ada@x"}'},
            },
            {"id": "c2", "type": "function", "function": {"name": "echo", "arguments": "{oops"}},
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": '{"name": "Ada"}'},
    {"role": "tool", "tool_call_id": "c2", "content": "error: arguments are not JSON"},
]
TOOLS = [
    {
        "type": "function",
        "function": {"name": "echo", "description": "Echo.", "parameters": {"type": "object"}},
    }
]


def test_the_openai_conversation_becomes_an_anthropic_messages_body():
    model = AnthropicMessagesModel("http://x", "")
    settings = ModelSettings(tool_choice="required", parallel_tool_calls=False, temperature=0.5)
    body = model.request_body("claude", CONVERSATION, TOOLS, settings)
    ephemeral = {"type": "ephemeral"}
    assert body == {
        "model": "claude",
        "max_tokens": 4096,
        "temperature": 0.5,
        "system": [{"type": "text", "text": "Be brief.", "cache_control": ephemeral}],
        "tools": [
            {
                "name": "echo",
                "description": "Echo.",
                "input_schema": {"type": "object"},
                "cache_control": ephemeral,
            }
        ],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "look up ada"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Looking."},
                    {
                        "type": "tool_use",
                        "id": "c1",
                        "name": "crm_lookup",
                        "input": {"email": "ada@x"},
                    },
                    {
                        "type": "tool_use",
                        "id": "c2",
                        "name": "echo",
                        "input": {"arguments_raw": "{oops"},
                    },
                ],
            },
            # Both results in one user message, right after the tool_use turn.
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "c1", "content": '{"name": "Ada"}'},
                    {
                        "type": "tool_result",
                        "tool_use_id": "c2",
                        "content": "error: arguments are not JSON",
                        "cache_control": ephemeral,
                    },
                ],
            },
        ],
    }


@pytest.mark.parametrize(
    ("choice", "parallel", "expected"),
    [
        ("", None, None),
        ("auto", None, {"type": "auto"}),
        ("none", False, {"type": "none"}),
        ("echo", None, {"type": "tool", "name": "echo"}),
        ("", False, {"type": "auto", "disable_parallel_tool_use": True}),
    ],
)
def test_tool_choice_in_anthropic_words(choice, parallel, expected):
    assert anthropic_messages.tool_choice(choice, parallel) == expected


def _response(**headers: str) -> CIMultiDict[str]:
    return CIMultiDict(headers)  # an answer's headers, as aiohttp gives them


def test_retry_after_reads_milliseconds_seconds_and_http_dates():
    now = 1_700_000_000.0
    assert retry_after(_response(**{"retry-after-ms": "1500", "retry-after": "9"})) == 1.5
    assert retry_after(_response(**{"retry-after": "2.5"})) == 2.5
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert retry_after(_response(**{"retry-after": date}), now=lambda: now) == 30.0
    past = email.utils.formatdate(now - 30, usegmt=True)
    assert retry_after(_response(**{"retry-after": past}), now=lambda: now) == 0.0
    assert retry_after(_response(**{"retry-after": "soon"})) is None
    assert retry_after(_response(**{"retry-after": "-4"})) == 0.0
    assert retry_after(_response(**{"retry-after": "nan"})) is None
    assert retry_after(_response()) is None


def test_a_missing_profiles_file_is_a_clear_startup_error(tmp_path):
    with pytest.raises(ValueError, match="AGENTRUN_MODEL_PROFILES: cannot read"):
        ExecutorConfig.from_env({"AGENTRUN_MODEL_PROFILES": str(tmp_path / "none.json")})
