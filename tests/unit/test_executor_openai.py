"""The OpenAI-compatible adapter against a scripted HTTP server standing in for the provider."""

from __future__ import annotations

import socket

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
from tests.harness.http_stub import DROP, STALL, Seen, reply, serving

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


async def ask(handler, tools=TOOLS, key: str = KEY, seen: list[Seen] | None = None):
    """One call of the adapter against a server answering with `handler`."""
    async with serving(handler) as stub:
        model = OpenAIChatModel(f"{stub.url}/v1/", key, 0.5)
        try:
            return await model.complete(
                "scenario-x", [{"role": "user", "content": "hi"}], tools, "r-9", 4
            )
        finally:
            await model.aclose()
            if seen is not None:
                seen.extend(stub.seen)


async def test_request_carries_model_messages_tools_key_and_run_headers():
    seen: list[Seen] = []
    answer = await ask(lambda r: reply(json=completion({"content": "hello"})), seen=seen)
    request = seen[0]
    assert (request.method, request.target) == ("POST", "/v1/chat/completions")
    assert request.headers["content-type"] == "application/json"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers["x-agentrun-run-id"] == "r-9"
    assert request.headers["x-agentrun-seq"] == "4"
    body = request.json()
    assert body["model"] == "scenario-x"
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["tools"] == TOOLS
    assert answer.content == "hello"
    assert answer.tool_calls == ()
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (12, 7)
    assert answer.usage.total == 19
    assert answer.response_id == "chatcmpl-1"


async def test_no_tools_means_no_tools_field_and_no_key_means_no_authorization():
    seen: list[Seen] = []
    await ask(lambda r: reply(json=completion({"content": "x"})), tools=[], key="", seen=seen)
    assert "tools" not in seen[0].json()
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

    answer = await ask(lambda r: reply(json=completion({"content": None, "tool_calls": calls})))
    assert answer.content is None
    assert answer.tool_calls == (
        ToolCall("a", "echo", {"text": "hi"}),
        ToolCall("b", "echo", None, arguments_raw="{text: hi"),
        ToolCall("c", "echo", None, arguments_raw="[1, 2]"),
        ToolCall("d", "sleep", {}),
    )
    assert answer.tool_calls[1].to_payload() == {
        "id": "b",
        "name": "echo",
        "arguments_raw": "{text: hi",
    }


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_server_errors_are_unavailable(status):
    with pytest.raises(ModelUnavailable, match=str(status)):
        await ask(lambda r: reply(status, {"error": {"message": "down"}}))


async def test_rate_limit_is_unavailable_with_retry_after():
    with pytest.raises(ModelUnavailable) as err:
        await ask(lambda r: reply(429, {"error": {}}, headers={"Retry-After": "7"}))
    assert err.value.retry_after == 7.0


async def test_client_errors_are_rejected_and_never_show_the_key():
    message = f"Incorrect API key provided: {KEY}"
    with pytest.raises(ModelRejected) as err:
        await ask(lambda r: reply(401, {"error": {"message": message}}))
    assert "401" in str(err.value)
    assert KEY not in str(err.value)
    assert "[redacted]" in str(err.value)


@pytest.mark.parametrize(
    "body", [{"choices": []}, {"id": "x"}, {"choices": [{"message": None}]}, "not json"]
)
async def test_a_response_without_choices_is_unavailable(body):
    answer = reply(text=body) if isinstance(body, str) else reply(json=body)
    with pytest.raises(ModelUnavailable, match="invalid response"):
        await ask(lambda r: answer)


async def test_connection_failure_is_unavailable_and_names_no_secret():
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: the connection is refused
    model = OpenAIChatModel(f"http://127.0.0.1:{closed.getsockname()[1]}/v1", KEY)
    try:
        with pytest.raises(ModelUnavailable) as err:
            await model.complete("m", [{"role": "user", "content": "hi"}], [], "r", 1)
    finally:
        await model.aclose()
        closed.close()
    assert str(err.value) == "model provider unreachable: ClientConnectorError"


@pytest.mark.parametrize(
    ("fault", "named"), [(STALL, "SocketTimeoutError"), (DROP, "ServerDisconnectedError")]
)
async def test_a_timeout_or_a_dropped_connection_is_unavailable(fault, named):
    with pytest.raises(ModelUnavailable, match=named):
        await ask(lambda r: fault)


async def test_usage_details_and_endings_are_read():
    body = completion({"content": "cut", "refusal": None})
    body["choices"][0]["finish_reason"] = "length"
    body["usage"] |= {
        "prompt_tokens_details": {"cached_tokens": 5},
        "completion_tokens_details": {"reasoning_tokens": 3},
    }

    answer = await ask(lambda r: reply(json=body))
    assert (answer.ending, answer.stop_reason, answer.refusal) == (TRUNCATED, "length", None)
    assert answer.usage == Usage(12, 7, cached_tokens=5, reasoning_tokens=3)
    assert answer.usage.to_payload() == {
        "prompt_tokens": 12,
        "completion_tokens": 7,
        "cached_tokens": 5,
        "reasoning_tokens": 3,
        "cache_write_tokens": 0,
    }


@pytest.mark.parametrize(
    ("status", "headers", "body", "error"),
    [
        (
            429,
            {},
            {"error": {"type": "insufficient_quota", "code": "insufficient_quota"}},
            ModelRejected,
        ),
        (429, {}, {"error": {"type": "requests", "code": "rate_limit_exceeded"}}, ModelUnavailable),
        (408, {}, {"error": {}}, ModelUnavailable),
        (409, {}, {"error": {}}, ModelUnavailable),
        (400, {"x-should-retry": "true"}, {"error": {}}, ModelUnavailable),
        (503, {"x-should-retry": "false"}, {"error": {}}, ModelRejected),
    ],
)
async def test_which_failures_are_transient(status, headers, body, error):
    with pytest.raises(error):
        await ask(lambda r: reply(status, body, headers=headers))


async def test_parameters_go_only_where_openai_accepts_them():
    settings = ModelSettings(max_tokens=50, tool_choice="required", parallel_tool_calls=True)
    messages = [{"role": "user", "content": "hi"}]
    async with serving(lambda r: reply(json=completion({"content": "x"}))) as stub:
        model = OpenAIChatModel(f"{stub.url}/v1", KEY, token_limit_field="max_completion_tokens")
        await model.complete("m", messages, TOOLS, "r", 1, settings=settings)
        await model.complete("m", messages, [], "r", 2, settings=settings)
        await model.aclose()
    with_tools, without = (seen.json() for seen in stub.seen)
    assert with_tools["max_completion_tokens"] == 50 and "max_tokens" not in with_tools
    assert (with_tools["tool_choice"], with_tools["parallel_tool_calls"]) == ("required", True)
    # OpenAI refuses tool_choice and parallel_tool_calls without tools.
    assert "tool_choice" not in without and "parallel_tool_calls" not in without
