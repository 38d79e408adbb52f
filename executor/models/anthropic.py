"""Adapter for the native Anthropic Messages API (`POST {base_url}/v1/messages`).

The request is built from the OpenAI-style conversation by
executor/models/anthropic_messages.py (system text, tools with `input_schema`,
`tool_use` / `tool_result` blocks, `cache_control` on the stable prefix).

`stop_reason` decides what the reply is: `end_turn`, `stop_sequence` and
`tool_use` are an answer (text, or tool calls to run); `max_tokens` and
`model_context_window_exceeded` are cut off and `refusal` is a refusal (the run
fails, executor/steps.py `failed_reply`); `pause_turn` (a server tool's loop
paused; we offer none) is taken as transient: the call is made again.

When streamed (`settings.on_delta`, executor/deltas.py) the call is made with
`stream: true` and the text told as it comes; the events are put back together into the body a
non-streamed call returns (executor/models/anthropic_stream.py), parsed the same way.

Usage: `prompt_tokens` is the whole input, `input_tokens +
cache_read_input_tokens + cache_creation_input_tokens` (Anthropic's
`input_tokens` counts only the part after the last cache breakpoint);
`cached_tokens` = cache reads, `cache_write_tokens` = cache creation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from executor.http_session import read
from executor.models import anthropic_messages as convert
from executor.models import anthropic_stream, streaming
from executor.models.base import (
    COMPLETE,
    DEFAULT_SETTINGS,
    REFUSED,
    TRUNCATED,
    ModelReply,
    ModelSettings,
    ModelUnavailable,
    ToolCall,
    Usage,
    garbled_is_unavailable,
    kept,
)
from executor.models.provider_http import Answer, ProviderHttp, json_body

API_VERSION = "2023-06-01"
# Anthropic requires max_tokens on every request: this one when neither the version
# nor the profile gives one.
DEFAULT_MAX_TOKENS = 4096
_ENDINGS = {
    "end_turn": COMPLETE,
    "stop_sequence": COMPLETE,
    "tool_use": COMPLETE,
    "max_tokens": TRUNCATED,
    "model_context_window_exceeded": TRUNCATED,
    "refusal": REFUSED,
}


class AnthropicMessagesModel:
    """POSTs `{base_url}/v1/messages` with `x-api-key` and `anthropic-version`."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        timeout_seconds: float = 60.0,
        *,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        api_version: str = API_VERSION,
    ) -> None:
        self._url = base_url.rstrip("/") + "/v1/messages"
        self._api_key = api_key
        self._version = api_version
        self._default_max_tokens = default_max_tokens or DEFAULT_MAX_TOKENS
        self._http = ProviderHttp(timeout_seconds, api_key)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def complete(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        run_id: str,
        seq: int,
        *,
        settings: ModelSettings = DEFAULT_SETTINGS,
    ) -> ModelReply:
        body = self.request_body(model, messages, tools, settings)
        headers = {
            "anthropic-version": self._version,
            "X-Agentrun-Run-Id": run_id,
            "X-Agentrun-Seq": str(seq),
        }
        if self._api_key:
            headers["x-api-key"] = self._api_key
        if settings.on_delta is not None:
            return await self._streamed(body, headers, settings)
        response = await self._http.post(self._url, body, headers, settings.timeout_seconds)
        return parse_message(response)

    async def _streamed(
        self, body: dict[str, Any], headers: dict[str, str], settings: ModelSettings
    ) -> ModelReply:
        """The same call with stream=true: text is told to `settings.on_delta` as it comes."""
        assert settings.on_delta is not None
        body = {**body, "stream": True}
        async with self._http.stream(self._url, body, headers, settings.timeout_seconds) as answer:
            if streaming.answers_whole(answer):
                return parse_message(await read(answer))
            data = await anthropic_stream.read(answer, settings.on_delta)
        return message_of(data)

    def request_body(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        settings: ModelSettings,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": settings.max_tokens or self._default_max_tokens,
            "messages": convert.conversation(messages),
        }
        if system := convert.system_blocks(messages):
            body["system"] = system
        if settings.temperature is not None:
            body["temperature"] = settings.temperature
        if tools:
            body["tools"] = convert.tools(tools)
            choice = convert.tool_choice(settings.tool_choice, settings.parallel_tool_calls)
            if choice is not None:
                body["tool_choice"] = choice
        return body


def parse_message(response: Answer) -> ModelReply:
    """A Messages API response as a ModelReply (garbled → ModelUnavailable)."""
    return message_of(json_body(response))


def message_of(data: Any) -> ModelReply:
    """A Messages API body (parsed, or put together from a stream) as a ModelReply; a
    body of another shape is ModelUnavailable (base.garbled_is_unavailable)."""
    with garbled_is_unavailable("response"):
        return kept(_message_of(data))


def _message_of(data: Any) -> ModelReply:
    if not isinstance(data, dict) or not isinstance(data.get("content"), list):
        raise ModelUnavailable("invalid response from model provider: no content")
    stop = str(data.get("stop_reason") or "")
    if stop == "pause_turn":
        raise ModelUnavailable("model provider paused the turn (stop reason pause_turn)", 0.0)
    text = [b.get("text", "") for b in data["content"] if _is(b, "text")]
    calls = tuple(
        _tool_call(block, index)
        for index, block in enumerate(b for b in data["content"] if _is(b, "tool_use"))
    )
    content = "".join(str(t) for t in text) if text else None
    ending = _ENDINGS.get(stop, COMPLETE)
    return ModelReply(
        content=content,
        tool_calls=calls,
        usage=usage_of(data.get("usage")),
        response_id=str(data.get("id") or ""),
        model=str(data.get("model") or ""),
        ending=ending,
        stop_reason=stop,
        refusal=(content or "") if ending == REFUSED else None,
    )


def usage_of(raw: Any) -> Usage:
    usage = raw if isinstance(raw, dict) else {}
    fresh = _count(usage.get("input_tokens"))
    read = _count(usage.get("cache_read_input_tokens"))
    written = _count(usage.get("cache_creation_input_tokens"))
    return Usage(
        prompt_tokens=fresh + read + written,
        completion_tokens=_count(usage.get("output_tokens")),
        cached_tokens=read,
        cache_write_tokens=written,
    )


def _is(block: Any, kind: str) -> bool:
    return isinstance(block, dict) and block.get("type") == kind


def _tool_call(block: Mapping[str, Any], index: int) -> ToolCall:
    call_id = str(block.get("id") or f"toolu_{index}")
    name = str(block.get("name") or "")
    arguments = block.get("input")
    if isinstance(arguments, dict):
        return ToolCall(call_id, name, arguments)
    # Recorded as the model sent it: a string as is (a streamed input that was not JSON),
    # any other JSON value as JSON.
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ToolCall(call_id, name, None, arguments_raw=raw)


def _count(value: Any) -> int:
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0
