"""OpenAI chat completions streamed (`stream: true`, server-sent events): each piece of
text is told as it arrives, and the chunks are put back together into the body a
non-streamed completion has, so the reply is parsed (and recorded) the same way."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp

from executor import storable
from executor.models.base import ModelUnavailable, garbled_is_unavailable


class Chunks:
    """The first choice of a streamed completion, as its chunks add up."""

    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.content: list[str] = []
        self.refusal: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish: str | None = None
        self.usage: Any = None
        self.seen_choice = False

    def add(self, chunk: Any) -> str:
        """Take one chunk in; the text it adds to the reply ("" if none)."""
        if not isinstance(chunk, dict):
            raise ModelUnavailable("invalid stream from model provider: a chunk is not an object")
        for key in ("id", "model"):
            if chunk.get(key) and key not in self.head:
                self.head[key] = chunk[key]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        text = ""
        for choice in listed(chunk.get("choices"), "choices"):
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                text += self._choice(choice)
        return text

    def _choice(self, choice: dict[str, Any]) -> str:
        self.seen_choice = True
        if choice.get("finish_reason"):
            self.finish = str(choice["finish_reason"])
        raw = choice.get("delta")
        delta: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if isinstance(delta.get("refusal"), str):
            self.refusal.append(delta["refusal"])
        for call in listed(delta.get("tool_calls"), "tool_calls"):
            if isinstance(call, dict):
                self._call(call)
        text = delta.get("content")
        if isinstance(text, str) and text:
            self.content.append(text)
            return text
        return ""

    def _call(self, call: dict[str, Any]) -> None:
        entry = self.calls.setdefault(
            index_of(call),
            {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
        )
        if call.get("id"):
            entry["id"] = str(call["id"])
        raw = call.get("function")
        function: dict[str, Any] = raw if isinstance(raw, dict) else {}
        entry["function"]["name"] += str(function.get("name") or "")
        arguments = function.get("arguments")
        entry["function"]["arguments"] += arguments if isinstance(arguments, str) else ""

    def completion(self) -> dict[str, Any]:
        """The chat.completion body these chunks stand for."""
        if not self.seen_choice:
            raise ModelUnavailable("invalid stream from model provider: no choices")
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self.content) if self.content else None,
            "refusal": "".join(self.refusal) if self.refusal else None,
        }
        if self.calls:
            message["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        return {
            **self.head,
            "choices": [{"index": 0, "finish_reason": self.finish, "message": message}],
            "usage": self.usage,
        }


def listed(value: Any, what: str) -> list[Any]:
    """A list field of a chunk (absent, null or empty: none); anything else is a garbled
    chunk."""
    if not value:
        return []
    if not isinstance(value, list):
        raise ModelUnavailable(f"invalid stream from model provider: {what} is not a list")
    return value


def index_of(item: dict[str, Any]) -> int:
    """An item's `index` (a tool call's in a chunk, a block's in an event); 0 if it has none
    or one that is not a whole number, as a provider that streams one item leaves it."""
    try:
        return int(item.get("index") or 0)
    except (TypeError, ValueError, OverflowError):
        return 0


def answers_whole(response: aiohttp.ClientResponse) -> bool:
    """Whether the provider answered a streamed request with the whole reply as JSON, as a
    server that ignores `stream: true` does (some OpenAI-compatible ones): it is then read
    as a non-streamed answer, with no delta told."""
    return response.content_type == "application/json"


async def data_of(response: aiohttp.ClientResponse) -> AsyncIterator[str]:
    """The `data:` payloads of a server-sent event stream, in order (blank separators,
    comments and `event:` names skipped: the data says its type)."""
    async for line in lines(response):
        if line.startswith("data:"):
            yield line[5:].strip()


async def lines(response: aiohttp.ClientResponse) -> AsyncIterator[str]:
    """The body's lines as they arrive (\n or \r\n endings, UTF-8), however long a line
    is (aiohttp's own line reader refuses one over 128 KiB)."""
    pending = b""
    async for chunk in response.content.iter_any():
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for raw in complete:
            yield raw.rstrip(b"\r").decode("utf-8", errors="replace")
    if pending:
        yield pending.rstrip(b"\r").decode("utf-8", errors="replace")


def decoded(data: str) -> Any:
    """One event's JSON; a payload that is not JSON is the provider's failure."""
    try:
        return storable.parse(data)
    except ValueError:
        raise ModelUnavailable("invalid stream from model provider: not JSON") from None


async def read(response: aiohttp.ClientResponse, on_delta: Callable[[str], None]) -> dict[str, Any]:
    """Read the event stream to its end, telling `on_delta` each piece of text."""
    chunks, done = Chunks(), False
    async for data in data_of(response):
        if data == "[DONE]":
            done = True
            break
        with garbled_is_unavailable("stream"):
            text = chunks.add(decoded(data))
        if text:
            on_delta(storable.text(text))
    if not done and chunks.finish is None:
        raise ModelUnavailable("model provider's stream ended before the reply did")
    return chunks.completion()
