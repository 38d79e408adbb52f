"""Both model adapters against the real sandbox model server (uvicorn, real HTTP).

Each case a real provider answers with (a cut-off reply, a content filter, a
refusal, an exhausted quota, 408/409/429/529 with each form of Retry-After, a
slow answer, prompt-cache and reasoning usage) is played by a scenario file and
must come out of the OpenAI chat completions adapter and the Anthropic Messages
adapter as the same ModelReply or exception.
"""

from __future__ import annotations

import email.utils
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from executor.models import profiles
from executor.models.anthropic import AnthropicMessagesModel
from executor.models.base import (
    COMPLETE,
    FILTERED,
    REFUSED,
    TRUNCATED,
    ModelRejected,
    ModelSettings,
    ModelUnavailable,
)
from executor.models.openai import OpenAIChatModel
from sandbox.model_server import create_app
from sandbox.scenario import DEFAULT_DIR
from sandbox.serve import BackgroundServer

KEY = "sk-sandbox-adapter-key-0123456789"
SHIPPED = (
    "cut_off",
    "content_filtered",
    "refuses",
    "out_of_quota",
    "overloaded",
    "paused_turn",
    "reasoner",
    "demo",
)
RETRY_DATE_SECONDS = 120


def _error_turn(status: int, kind: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    error = {"status": status, "type": kind, "message": f"scripted {status}"}
    return {"turns": [{"error": {**error, "headers": headers or {}}}]}


def _scenarios(directory: Path) -> float:
    """Write the scenarios; returns the time the `busy_until` HTTP-date names."""
    for name in SHIPPED:
        shutil.copy(DEFAULT_DIR / f"{name}.json", directory / f"{name}.json")
    until = float(int(time.time() + RETRY_DATE_SECONDS))  # an HTTP-date has whole seconds
    when = email.utils.formatdate(until, usegmt=True)
    extra = {
        "timeout408": _error_turn(408, "timeout", {"retry-after": "2"}),
        "conflict409": _error_turn(409, "conflict", {"retry-after-ms": "250"}),
        "busy_until": _error_turn(503, "server_error", {"retry-after": when}),
        "rate_limited": _error_turn(429, "rate_limit_error", {"retry-after": "7"}),
        "no_credit": _error_turn(402, "billing_error"),
        "bad_request": _error_turn(400, "invalid_request_error"),
        "slow": {"latency_ms": [800, 800], "turns": [{"content": "late"}]},
    }
    for name, data in extra.items():
        (directory / f"{name}.json").write_text(json.dumps(data))
    return until


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    directory = tmp_path_factory.mktemp("scenarios")
    until = _scenarios(directory)
    with BackgroundServer(create_app(scenarios_dir=directory, api_key=KEY)) as running:
        running.busy_until = until  # type: ignore[attr-defined]
        yield running


@pytest.fixture(params=["openai", "anthropic"])
def api(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def adapter(server: BackgroundServer, api: str, **options: Any) -> Any:
    if api == "openai":
        return OpenAIChatModel(f"{server.url}/v1", KEY, 5.0, **options)
    return AnthropicMessagesModel(server.url, KEY, 5.0, **options)


def requests_of(server: BackgroundServer, run_id: str) -> list[dict[str, Any]]:
    entries = httpx.get(f"{server.url}/_sandbox/requests").json()["requests"]
    return [e for e in entries if e["run_id"] == run_id]


ECHO = {
    "type": "function",
    "function": {
        "name": "echo",
        "description": "Echo text.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
    },
}
SYSTEM = {"role": "system", "content": "You are a careful test agent."}
USER = {"role": "user", "content": "hello adapters"}


async def ask(
    server: BackgroundServer,
    api: str,
    scenario: str,
    messages: list[dict[str, Any]] | None = None,
    run_id: str = "r-1",
    settings: ModelSettings | None = None,
    **options: Any,
) -> Any:
    model = adapter(server, api, **options)
    try:
        return await model.complete(
            scenario,
            messages or [SYSTEM, USER],
            [ECHO],
            run_id,
            1,
            settings=settings or ModelSettings(),
        )
    finally:
        await model.aclose()


async def test_a_tool_call_and_its_result_round_trip_through_both_apis(server, api):
    run_id = f"round-{api}"
    first = await ask(server, api, "reasoner", run_id=run_id)
    assert first.ending == COMPLETE
    assert first.stop_reason == ("tool_calls" if api == "openai" else "tool_use")
    [call] = first.tool_calls
    assert (call.name, call.arguments) == ("echo", {"text": "hello adapters"})
    # The conversation as executor/replay.py rebuilds it: assistant tool_calls, role=tool.
    history = [
        SYSTEM,
        USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "echo", "arguments": json.dumps(call.arguments)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": '{"echoed": "hello adapters"}'},
    ]
    second = await ask(server, api, "reasoner", history, run_id=run_id)
    assert second.content == 'Echoed: {"echoed": "hello adapters"}'
    assert second.ending == COMPLETE and second.tool_calls == ()
    assert [e["turn"] for e in requests_of(server, run_id)] == [0, 1]


async def test_usage_reports_cache_reads_writes_and_reasoning(server, api):
    run_id = f"usage-{api}"
    # Instructions of its own: no earlier test has put this prefix in the cache.
    messages = [{"role": "system", "content": f"instructions of {run_id}"}, USER]
    first = await ask(server, api, "reasoner", messages, run_id=run_id)
    again = await ask(server, api, "reasoner", messages, run_id=run_id)
    for usage in (first.usage, again.usage):
        assert usage.prompt_tokens > 0 and usage.completion_tokens > 0
    # The same prompt again: its cacheable prefix is read from the cache.
    assert again.usage.cached_tokens > 0
    assert again.usage.cached_tokens <= again.usage.prompt_tokens
    if api == "openai":
        assert first.usage.reasoning_tokens == again.usage.reasoning_tokens == 48
        assert first.usage.completion_tokens > 48  # reasoning is part of the completion
        assert first.usage.cache_write_tokens == 0  # OpenAI reports no cache writes
    else:
        # cache_control marks the prefix: written first, then read; prompt_tokens is the
        # whole input (input + cache read + cache creation).
        # (The tools' prefix, shared with earlier tests, may already be cached.)
        assert first.usage.cache_write_tokens > 0
        assert again.usage.cache_write_tokens == 0
        assert (
            again.usage.cached_tokens == first.usage.cached_tokens + first.usage.cache_write_tokens
        )
        assert again.usage.prompt_tokens == first.usage.prompt_tokens
        assert requests_of(server, run_id)[0]["cache_breakpoints"] == 3


@pytest.mark.parametrize(
    ("scenario", "ending", "openai_reason", "anthropic_reason"),
    [
        ("cut_off", TRUNCATED, "length", "max_tokens"),
        ("content_filtered", FILTERED, "content_filter", "refusal"),
        ("refuses", REFUSED, "stop", "refusal"),
    ],
)
async def test_replies_that_are_no_answer_say_so(
    server, api, scenario, ending, openai_reason, anthropic_reason
):
    reply = await ask(server, api, scenario)
    expected = ending if api == "openai" or ending != FILTERED else REFUSED
    assert reply.ending == expected
    assert reply.stop_reason == (openai_reason if api == "openai" else anthropic_reason)
    if scenario == "refuses":
        assert reply.refusal == "I can't help with that request."


async def test_anthropic_pause_turn_is_asked_again(server):
    with pytest.raises(ModelUnavailable, match="pause_turn"):
        await ask(server, "anthropic", "paused_turn")
    assert (await ask(server, "openai", "paused_turn")).ending == COMPLETE


@pytest.mark.parametrize("scenario", ["out_of_quota", "no_credit", "bad_request"])
async def test_exhausted_quota_and_bad_requests_fail_for_good(server, api, scenario):
    with pytest.raises(ModelRejected) as err:
        await ask(server, api, scenario)
    if scenario == "out_of_quota":  # OpenAI: 429 insufficient_quota; Anthropic: 402 billing
        assert "quota or credit exhausted" in err.value.reason
    assert KEY not in err.value.reason


@pytest.mark.parametrize(
    ("scenario", "wait"),
    [("timeout408", 2.0), ("conflict409", 0.25), ("rate_limited", 7.0), ("overloaded", 1.5)],
)
async def test_transient_statuses_carry_the_providers_wait(server, api, scenario, wait):
    with pytest.raises(ModelUnavailable) as err:
        await ask(server, api, scenario)
    assert err.value.retry_after == wait


async def test_retry_after_as_an_http_date(server, api):
    with pytest.raises(ModelUnavailable) as err:
        await ask(server, api, "busy_until")
    expected = server.busy_until - time.time()
    assert err.value.retry_after is not None
    assert expected - 2 <= err.value.retry_after <= expected + 1


async def test_the_versions_timeout_bounds_the_call(server, api):
    with pytest.raises(ModelUnavailable, match="SocketTimeoutError"):
        await ask(server, api, "slow", settings=ModelSettings(timeout_seconds=0.2))
    assert (await ask(server, api, "slow")).content == "late"  # the 5s default waits


async def test_model_parameters_reach_the_provider(server, api):
    run_id = f"params-{api}"
    settings = ModelSettings(
        max_tokens=321, temperature=0.25, tool_choice="echo", parallel_tool_calls=False
    )
    await ask(server, api, "demo", run_id=run_id, settings=settings)
    [entry] = requests_of(server, run_id)
    if api == "openai":
        assert entry["params"] == {
            "max_tokens": 321,
            "temperature": 0.25,
            "parallel_tool_calls": False,
            "tool_choice": {"type": "function", "function": {"name": "echo"}},
        }
    else:
        assert entry["params"] == {
            "max_tokens": 321,
            "temperature": 0.25,
            "tool_choice": {"type": "tool", "name": "echo", "disable_parallel_tool_use": True},
        }


async def test_openai_output_limit_field_and_anthropic_default_max_tokens(server, api):
    run_id = f"limits-{api}"
    if api == "openai":
        await ask(
            server,
            api,
            "demo",
            run_id=run_id,
            token_limit_field="max_completion_tokens",
            default_max_tokens=99,
        )
        assert requests_of(server, run_id)[0]["params"] == {"max_completion_tokens": 99}
    else:  # max_tokens is required by the Messages API: always sent
        await ask(server, api, "demo", run_id=run_id)
        assert requests_of(server, run_id)[0]["params"] == {"max_tokens": 4096}


async def test_a_wrong_key_is_rejected_and_never_echoed(server, api):
    model = (
        OpenAIChatModel(f"{server.url}/v1", "sk-wrong-key-42", 5.0)
        if api == "openai"
        else AnthropicMessagesModel(server.url, "sk-wrong-key-42", 5.0)
    )
    try:
        with pytest.raises(ModelRejected, match="401") as err:
            await model.complete("demo", [USER], [], "r-key", 1)
    finally:
        await model.aclose()
    assert "sk-wrong-key-42" not in err.value.reason


async def test_the_router_calls_each_profile_on_its_api_with_its_model(server):
    env = {"SANDBOX_KEY": KEY}
    configured = profiles.parse_profiles(
        json.dumps(
            {
                "claude": {
                    "provider": "anthropic",
                    "base_url": server.url,
                    "model": "demo",
                    "api_key_env": "SANDBOX_KEY",
                },
                "gpt": {
                    "provider": "openai",
                    "base_url": f"{server.url}/v1",
                    "api_key_env": "SANDBOX_KEY",
                },
            }
        ),
        env,
    )
    default = OpenAIChatModel(f"{server.url}/v1", KEY, 5.0)
    router = profiles.ModelRouter(default, configured, 5.0)
    try:
        for profile in ("claude", "gpt", ""):
            reply = await router.complete(
                "reasoner",
                [SYSTEM, USER],
                [ECHO],
                f"route-{profile or 'default'}",
                1,
                settings=ModelSettings(profile=profile),
            )
            assert reply.ending == COMPLETE
        with pytest.raises(ModelUnavailable, match="'other' is not configured"):
            await router.complete(
                "demo", [USER], [], "route-x", 1, settings=ModelSettings(profile="other")
            )
    finally:
        await router.aclose()
    seen = {
        run_id: [(e["api"], e["model"]) for e in requests_of(server, run_id)]
        for run_id in ("route-claude", "route-gpt", "route-default", "route-x")
    }
    # The profile's model name wins over the version's; without one, the version's is sent.
    assert seen["route-claude"] == [("anthropic", "demo")]
    assert seen["route-gpt"] == [("openai", "reasoner")]
    assert seen["route-default"] == [("openai", "reasoner")]
    assert seen["route-x"] == []  # nothing sent for a profile this executor lacks
