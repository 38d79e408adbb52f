"""Adapter for any OpenAI-compatible chat completions endpoint (OpenAI, Ollama, vLLM …).

`finish_reason` `stop` and `tool_calls` are an answer; `length` is a reply cut
off at the output limit and `content_filter` one the provider stopped, and a
`message.refusal` is a refusal: none of them is acted on (the run fails,
executor/steps.py `failed_reply`). Failures are sorted by
executor/models/provider_http.py (429 `insufficient_quota` fails the run; 408,
409, 429 and 5xx are transient). Usage reads `prompt_tokens_details.cached_tokens`
and `completion_tokens_details.reasoning_tokens` when the server sends them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from executor import storable
from executor.http_session import read
from executor.models import streaming
from executor.models.base import (
    COMPLETE,
    DEFAULT_SETTINGS,
    FILTERED,
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


class OpenAIChatModel:
    """POSTs `{base_url}/chat/completions` with a bearer key and parses the first choice.

    `token_limit_field`: how this endpoint names the output limit, `max_tokens`
    (most compatible servers) or `max_completion_tokens` (OpenAI's reasoning models
    accept only that one). `default_max_tokens`: sent when the version sets none
    (0: none sent).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        timeout_seconds: float = 60.0,
        *,
        token_limit_field: str = "max_tokens",
        default_max_tokens: int = 0,
    ) -> None:
        if token_limit_field not in TOKEN_LIMIT_FIELDS:
            raise ValueError(f"token_limit_field must be one of {TOKEN_LIMIT_FIELDS}")
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._api_key = api_key
        self._limit_field = token_limit_field
        self._default_max_tokens = default_max_tokens
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
        headers = {"X-Agentrun-Run-Id": run_id, "X-Agentrun-Seq": str(seq)}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        if settings.on_delta is not None:
            return await self._streamed(body, headers, settings)
        response = await self._http.post(self._url, body, headers, settings.timeout_seconds)
        return parse_completion(response)

    async def _streamed(
        self, body: dict[str, Any], headers: dict[str, str], settings: ModelSettings
    ) -> ModelReply:
        """The same call with stream=true: text is told to `settings.on_delta` as it comes."""
        assert settings.on_delta is not None
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        async with self._http.stream(self._url, body, headers, settings.timeout_seconds) as answer:
            if streaming.answers_whole(answer):
                return parse_completion(await read(answer))
            data = await streaming.read(answer, settings.on_delta)
        return completion_of(data)

    def request_body(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        settings: ModelSettings,
    ) -> dict[str, Any]:
        """The chat completions request; tool options only go with tools (OpenAI refuses
        `tool_choice` and `parallel_tool_calls` without them)."""
        body: dict[str, Any] = {"model": model, "messages": list(messages)}
        if max_tokens := settings.max_tokens or self._default_max_tokens:
            body[self._limit_field] = max_tokens
        if settings.temperature is not None:
            body["temperature"] = settings.temperature
        if tools:
            body["tools"] = list(tools)
            if settings.tool_choice:
                body["tool_choice"] = _tool_choice(settings.tool_choice)
            if settings.parallel_tool_calls is not None:
                body["parallel_tool_calls"] = settings.parallel_tool_calls
        return body


TOKEN_LIMIT_FIELDS = ("max_tokens", "max_completion_tokens")
# finish_reason -> how the reply ended ("stop", "tool_calls", "function_call": complete).
_ENDINGS = {"length": TRUNCATED, "content_filter": FILTERED}


def _tool_choice(choice: str) -> str | dict[str, Any]:
    if choice in ("auto", "none", "required"):
        return choice
    return {"type": "function", "function": {"name": choice}}


def parse_completion(response: Answer) -> ModelReply:
    """Turn a chat completions response into a ModelReply (no choices → ModelUnavailable)."""
    return completion_of(json_body(response))


def completion_of(data: Any) -> ModelReply:
    """A chat completions body (parsed, or put together from a stream) as a ModelReply; a
    body of another shape is ModelUnavailable (base.garbled_is_unavailable)."""
    with garbled_is_unavailable("response"):
        return kept(_completion_of(data))


def _completion_of(data: Any) -> ModelReply:
    try:
        choice = data["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError) as exc:
        raise ModelUnavailable("invalid response from model provider: no choices") from exc
    if not isinstance(message, dict):
        raise ModelUnavailable("invalid response from model provider: no message")
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise ModelUnavailable("invalid response from model provider: tool_calls is not a list")
    calls = tuple(_tool_call(raw, index) for index, raw in enumerate(raw_calls))
    content = message.get("content")
    refusal = message.get("refusal")
    finish = str(choice.get("finish_reason") or "")
    ending = REFUSED if isinstance(refusal, str) else _ENDINGS.get(finish, COMPLETE)
    return ModelReply(
        content=content if isinstance(content, str) else None,
        tool_calls=calls,
        usage=usage_of(data.get("usage")),
        response_id=str(data.get("id") or ""),
        model=str(data.get("model") or ""),
        ending=ending,
        stop_reason=finish,
        refusal=refusal if isinstance(refusal, str) else None,
    )


def usage_of(raw: Any) -> Usage:
    """OpenAI usage: `prompt_tokens` includes the cached ones, `completion_tokens` the
    reasoning ones (`*_tokens_details`, absent on many compatible servers)."""
    usage = raw if isinstance(raw, dict) else {}
    prompt = usage.get("prompt_tokens_details") or {}
    completion = usage.get("completion_tokens_details") or {}
    return Usage(
        prompt_tokens=_count(usage.get("prompt_tokens")),
        completion_tokens=_count(usage.get("completion_tokens")),
        cached_tokens=_count(prompt.get("cached_tokens") if isinstance(prompt, dict) else 0),
        reasoning_tokens=_count(
            completion.get("reasoning_tokens") if isinstance(completion, dict) else 0
        ),
    )


def _count(value: Any) -> int:
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


def _tool_call(raw: Any, index: int) -> ToolCall:
    function = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(function, dict):
        raise ModelUnavailable("invalid response from model provider: a tool call has no function")
    name = str(function.get("name") or "")
    call_id = str(raw.get("id") or f"call_{index}")
    arguments = function.get("arguments")
    if isinstance(arguments, dict):  # some servers send an object, not a JSON string
        return ToolCall(call_id, name, arguments)
    text = arguments if isinstance(arguments, str) else ""
    if not text.strip():
        return ToolCall(call_id, name, {})
    try:
        parsed = storable.parse(text)
    except ValueError:
        return ToolCall(call_id, name, None, arguments_raw=text)
    if not isinstance(parsed, dict):
        return ToolCall(call_id, name, None, arguments_raw=text)
    return ToolCall(call_id, name, parsed)
