"""Anthropic Messages streamed (`stream: true`, server-sent events): each piece of text is
told as it arrives, and the events are put back together into the body a non-streamed
message has, so the reply is parsed (and recorded) the same way (anthropic.message_of).

The events: `message_start` (the message without content, its input usage),
`content_block_start` / `content_block_delta` (`text_delta`, `input_json_delta`;
`thinking_delta` and `signature_delta` are kept out, as a non-streamed reply's
thinking blocks are) / `content_block_stop` per block, `message_delta` (the stop
reason and the usage so far, which replaces the earlier counts), `message_stop`,
`ping`s anywhere, and `error` (an overload in the middle of the stream: transient).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp

from executor import storable
from executor.models import streaming
from executor.models.base import ModelUnavailable, garbled_is_unavailable


class Events:
    """A streamed message, as its events add up."""

    def __init__(self) -> None:
        self.message: dict[str, Any] | None = None
        self.blocks: dict[int, dict[str, Any]] = {}
        self.json: dict[int, list[str]] = {}
        self.stopped = False

    def add(self, event: Any) -> str:
        """Take one event in; the text it adds to the reply ("" if none)."""
        if not isinstance(event, dict):
            raise ModelUnavailable("invalid stream from model provider: an event is not an object")
        kind = event.get("type")
        if kind == "error":
            error = _object(event.get("error"))
            raise ModelUnavailable(
                f"model provider's stream failed: {error.get('type') or 'error'}"
            )
        if kind == "message_start" and isinstance(event.get("message"), dict):
            self.message = {**event["message"], "content": []}
        elif kind == "content_block_start" and isinstance(event.get("content_block"), dict):
            self.blocks[streaming.index_of(event)] = dict(event["content_block"])
        elif kind == "content_block_delta":
            return self._delta(streaming.index_of(event), event.get("delta"))
        elif kind == "message_delta":
            self._message_delta(event)
        elif kind == "message_stop":
            self.stopped = True
        return ""

    def _delta(self, index: int, delta: Any) -> str:
        block = self.blocks.get(index)
        if block is None or not isinstance(delta, dict):
            return ""
        if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
            block["text"] = str(block.get("text") or "") + delta["text"]
            return str(delta["text"])
        if delta.get("type") == "input_json_delta":
            self.json.setdefault(index, []).append(str(delta.get("partial_json") or ""))
        return ""

    def _message_delta(self, event: dict[str, Any]) -> None:
        if self.message is None:
            raise ModelUnavailable("invalid stream from model provider: no message_start")
        delta = _object(event.get("delta"))
        for key in ("stop_reason", "stop_sequence"):
            if key in delta:
                self.message[key] = delta[key]
        usage = event.get("usage")
        if isinstance(usage, dict):  # counts so far: each one given replaces the earlier
            given = {k: v for k, v in usage.items() if v is not None}
            self.message["usage"] = {**_object(self.message.get("usage")), **given}

    def body(self) -> dict[str, Any]:
        """The Messages API response body these events stand for."""
        if self.message is None or not self.stopped:
            raise ModelUnavailable("model provider's stream ended before the reply did")
        content = []
        for index in sorted(self.blocks):
            block = self.blocks[index]
            if block.get("type") == "tool_use" and index in self.json:
                block["input"] = _input("".join(self.json[index]))
            content.append(block)
        return {**self.message, "content": content}


async def read(response: aiohttp.ClientResponse, on_delta: Callable[[str], None]) -> dict[str, Any]:
    """Read the event stream to its end, telling `on_delta` each piece of text."""
    events = Events()
    async for data in streaming.data_of(response):
        with garbled_is_unavailable("stream"):
            text = events.add(streaming.decoded(data))
        if text:
            on_delta(storable.text(text))
        if events.stopped:
            break
    return events.body()


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _input(text: str) -> Any:
    """A tool_use block's input from its JSON pieces: the object, {} for none, or the text
    itself when it is not JSON (anthropic._tool_call keeps it as arguments_raw)."""
    if not text.strip():
        return {}
    try:
        return storable.parse(text)
    except ValueError:
        return text
