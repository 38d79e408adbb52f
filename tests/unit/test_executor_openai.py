"""The OpenAI-compatible adapter against an HTTP-level stand-in for the provider."""

from __future__ import annotations

import json

import httpx
import pytest

from executor.models.base import (
    TRUNCATED,
    ModelRejected,
    ModelSettings,
    ModelUnavailable,
    ToolCall,
    Usage,
)
from executor.models.openai import OpenAIChatModel

KEY = "sk-test-secret-123"
TOOLS = [{"type": "function", "function": {"name": "echo", "description": "", "parameters": {}}}]


def completion(message: dict, **extra) -> dict:
    return {
        "id": "chatcmpl-1",
        "model": "scenario-x",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
        **extra,
    }


def model_for(handler, key: str = KEY) -> OpenAIChatModel:
    return OpenAIChatModel("http://model.test/v1/", key, transport=httpx.MockTransport(handler))


async def ask(model: OpenAIChatModel, tools=TOOLS):
    return await model.complete("scenario-x", [{"role": "user", "content": "hi"}], tools, "r-9", 4)


async def test_request_carries_model_messages_tools_key_and_run_headers():
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=completion({"content": "hello"}))

    reply = await ask(model_for(handler))
    request = seen[0]
    assert request.url == "http://model.test/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers["x-agentrun-run-id"] == "r-9"
    assert request.headers["x-agentrun-seq"] == "4"
    body = json.loads(request.content)
    assert body["model"] == "scenario-x"
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["tools"] == TOOLS
    assert reply.content == "hello"
    assert reply.tool_calls == ()
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (12, 7)
    assert reply.usage.total == 19
    assert reply.response_id == "chatcmpl-1"


async def test_no_tools_means_no_tools_field_and_no_key_means_no_authorization():
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=completion({"content": "x"}))

    await ask(model_for(handler, key=""), tools=[])
    assert "tools" not in json.loads(seen[0].content)
    assert "authorization" not in seen[0].headers


async def test_tool_calls_are_parsed_and_invalid_json_kept_raw():
    calls = [
        {
            "id": "a",
            "type": "function",
            "function": {"name": "echo", "arguments": '{"text": "hi"}'},
        },
        {"id": "b", "type": "function", "function": {"name": "echo", "arguments": "{text: hi"}},
        {"id": "c", "type": "function", "function": {"name": "echo", "arguments": "[1, 2]"}},
        {"id": "d", "type": "function", "function": {"name": "sleep", "arguments": ""}},
    ]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=completion({"content": None, "tool_calls": calls}))

    reply = await ask(model_for(handler))
    assert reply.content is None
    assert reply.tool_calls == (
        ToolCall("a", "echo", {"text": "hi"}),
        ToolCall("b", "echo", None, arguments_raw="{text: hi"),
        ToolCall("c", "echo", None, arguments_raw="[1, 2]"),
        ToolCall("d", "sleep", {}),
    )
    assert reply.tool_calls[1].to_payload() == {
        "id": "b",
        "name": "echo",
        "arguments_raw": "{text: hi",
    }


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_server_errors_are_unavailable(status):
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json={"error": {"message": "down"}})

    with pytest.raises(ModelUnavailable, match=str(status)):
        await ask(model_for(handler))


async def test_rate_limit_is_unavailable_with_retry_after():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, headers={"retry-after": "7"}, json={"error": {}})

    with pytest.raises(ModelUnavailable) as err:
        await ask(model_for(handler))
    assert err.value.retry_after == 7.0


async def test_client_errors_are_rejected_and_never_show_the_key():
    def handler(request: httpx.Request) -> httpx.Response:
        message = f"Incorrect API key provided: {KEY}"
        return httpx.Response(401, json={"error": {"message": message}})

    with pytest.raises(ModelRejected) as err:
        await ask(model_for(handler))
    assert "401" in str(err.value)
    assert KEY not in str(err.value)
    assert "[redacted]" in str(err.value)


@pytest.mark.parametrize(
    "body", [{"choices": []}, {"id": "x"}, {"choices": [{"message": None}]}, "not json"]
)
async def test_a_response_without_choices_is_unavailable(body):
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(body, str):
            return httpx.Response(200, text=body)
        return httpx.Response(200, json=body)

    with pytest.raises(ModelUnavailable, match="invalid response"):
        await ask(model_for(handler))


async def test_connection_failure_is_unavailable_and_names_no_secret():
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(ModelUnavailable) as err:
        await ask(model_for(handler))
    assert str(err.value) == "model provider unreachable: ConnectError"


async def test_timeout_is_unavailable():
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    with pytest.raises(ModelUnavailable, match="ReadTimeout"):
        await ask(model_for(handler))


async def test_usage_details_and_endings_are_read():
    body = completion({"content": "cut", "refusal": None})
    body["choices"][0]["finish_reason"] = "length"
    body["usage"] |= {
        "prompt_tokens_details": {"cached_tokens": 5},
        "completion_tokens_details": {"reasoning_tokens": 3},
    }

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=body)

    reply = await ask(model_for(handler))
    assert (reply.ending, reply.stop_reason, reply.refusal) == (TRUNCATED, "length", None)
    assert reply.usage == Usage(12, 7, cached_tokens=5, reasoning_tokens=3)
    assert reply.usage.to_payload() == {
        "prompt_tokens": 12,
        "completion_tokens": 7,
        "cached_tokens": 5,
        "reasoning_tokens": 3,
        "cache_write_tokens": 0,
    }


@pytest.mark.parametrize(
    ("status", "headers", "body", "error"),
    [
        (429, {}, {"error": {"type": "insufficient_quota", "code": "insufficient_quota"}},
         ModelRejected),
        (429, {}, {"error": {"type": "requests", "code": "rate_limit_exceeded"}}, ModelUnavailable),
        (408, {}, {"error": {}}, ModelUnavailable),
        (409, {}, {"error": {}}, ModelUnavailable),
        (400, {"x-should-retry": "true"}, {"error": {}}, ModelUnavailable),
        (503, {"x-should-retry": "false"}, {"error": {}}, ModelRejected),
    ],
)  # fmt: skip
async def test_which_failures_are_transient(status, headers, body, error):
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers=headers, json=body)

    with pytest.raises(error):
        await ask(model_for(handler))


async def test_parameters_go_only_where_openai_accepts_them():
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json=completion({"content": "x"}))

    model = OpenAIChatModel(
        "http://model.test/v1", KEY, transport=httpx.MockTransport(handler),
        token_limit_field="max_completion_tokens",
    )  # fmt: skip
    settings = ModelSettings(max_tokens=50, tool_choice="required", parallel_tool_calls=True)
    messages = [{"role": "user", "content": "hi"}]
    await model.complete("m", messages, TOOLS, "r", 1, settings=settings)
    await model.complete("m", messages, [], "r", 2, settings=settings)
    with_tools, without = seen
    assert with_tools["max_completion_tokens"] == 50 and "max_tokens" not in with_tools
    assert (with_tools["tool_choice"], with_tools["parallel_tool_calls"]) == ("required", True)
    # OpenAI refuses tool_choice and parallel_tool_calls without tools.
    assert "tool_choice" not in without and "parallel_tool_calls" not in without
