"""Adapter for any OpenAI-compatible chat completions endpoint (OpenAI, Ollama, vLLM …)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from executor.models.base import ModelRejected, ModelReply, ModelUnavailable, ToolCall, Usage
from executor.retry_after import retry_after


class OpenAIChatModel:
    """POSTs `{base_url}/chat/completions` with a bearer key and parses the first choice."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        timeout_seconds: float = 60.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._api_key = api_key
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(timeout_seconds), transport=transport)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def complete(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        run_id: str,
        seq: int,
    ) -> ModelReply:
        body: dict[str, Any] = {"model": model, "messages": list(messages)}
        if tools:
            body["tools"] = list(tools)
        headers = {"X-Agentrun-Run-Id": run_id, "X-Agentrun-Seq": str(seq)}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        try:
            response = await self._http.post(self._url, json=body, headers=headers)
        except httpx.TransportError as exc:
            # Only the exception's class: its text may carry the URL, never headers,
            # but there is nothing in it worth the risk.
            raise ModelUnavailable(f"model provider unreachable: {type(exc).__name__}") from exc
        if response.status_code == 429 or response.status_code >= 500:
            raise ModelUnavailable(
                f"model provider returned {response.status_code}", retry_after(response)
            )
        if response.status_code >= 400:
            raise ModelRejected(
                f"model provider rejected the request ({response.status_code}): "
                f"{self._redact(_error_text(response))}"
            )
        return parse_completion(response)

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "[redacted]") if self._api_key else text


def parse_completion(response: httpx.Response) -> ModelReply:
    """Turn a chat completions response into a ModelReply (no choices → ModelUnavailable)."""
    try:
        data = response.json()
        message = data["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ModelUnavailable("invalid response from model provider: no choices") from exc
    if not isinstance(message, dict):
        raise ModelUnavailable("invalid response from model provider: no message")
    calls = tuple(
        _tool_call(raw, index) for index, raw in enumerate(message.get("tool_calls") or [])
    )
    usage = data.get("usage") or {}
    content = message.get("content")
    return ModelReply(
        content=content if isinstance(content, str) else None,
        tool_calls=calls,
        usage=Usage(
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
        ),
        response_id=str(data.get("id") or ""),
        model=str(data.get("model") or ""),
    )


def _tool_call(raw: Mapping[str, Any], index: int) -> ToolCall:
    function = raw.get("function") or {}
    name = str(function.get("name") or "")
    call_id = str(raw.get("id") or f"call_{index}")
    arguments = function.get("arguments")
    if isinstance(arguments, dict):  # some servers send an object, not a JSON string
        return ToolCall(call_id, name, arguments)
    text = arguments if isinstance(arguments, str) else ""
    if not text.strip():
        return ToolCall(call_id, name, {})
    try:
        parsed = json.loads(text)
    except ValueError:
        return ToolCall(call_id, name, None, arguments_raw=text)
    if not isinstance(parsed, dict):
        return ToolCall(call_id, name, None, arguments_raw=text)
    return ToolCall(call_id, name, parsed)


def _error_text(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("message") or "")[:300]
    return str(error or body)[:300]
