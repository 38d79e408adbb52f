"""The Anthropic Messages API side of the model sandbox (`POST /v1/messages`).

The request is checked the way the real API checks it (a `max_tokens`,
messages alternating from `user`, every `tool_use` answered by a `tool_result`
in the next user message, at most 4 `cache_control` breakpoints), then turned
into the OpenAI-style message list the scenarios play against
(sandbox/scenario.py), so one scenario file serves both APIs.

Asked with `"stream": true`, the message is sent as the API streams one
(`message_events`): `message_start` (no content, the input usage), per block
`content_block_start`, `content_block_delta`s (text a word or so at a time,
`text_delta`; a tool's input as its JSON in a few `input_json_delta` pieces) and
`content_block_stop`, a `ping`, `message_delta` (stop reason, output usage) and
`message_stop`.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from sandbox.prompt_cache import CacheUse
from sandbox.scenario import Reply

MAX_BREAKPOINTS = 4
# The API's error type for a status (https://docs.anthropic.com/en/api/errors).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
# finish_reason (OpenAI words in a scenario) -> stop_reason.
_STOPS = {"length": "max_tokens", "content_filter": "refusal"}


class InvalidRequest(ValueError):
    """A request the real API would refuse with 400 invalid_request_error."""


def error_type(status: int, kind: str) -> str:
    """The Anthropic error type: the scenario's own when it is one, else the status's."""
    if kind in ERROR_TYPES.values():
        return kind
    return ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_status(status: int, kind: str) -> int:
    """OpenAI's exhausted quota (429 insufficient_quota) is Anthropic's 402 billing_error."""
    return 402 if kind == "insufficient_quota" else status


def error_body(status: int, message: str, kind: str) -> dict[str, Any]:
    kind = "billing_error" if kind == "insufficient_quota" else kind
    return {"type": "error", "error": {"type": error_type(status, kind), "message": message}}


def parse_request(body: Any) -> tuple[str, list[dict[str, Any]], list[Any], list[int]]:
    """(model, OpenAI-style messages, prompt parts, cache breakpoints) of a request."""
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    model, messages = body.get("model"), body.get("messages")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model: Field required")
    if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] < 1:
        raise InvalidRequest("max_tokens: Field required (a positive integer)")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages: at least one message is required")
    system = _system_blocks(body.get("system"))
    tools = body.get("tools") or []
    if not isinstance(tools, list) or not all(_tool_ok(t) for t in tools):
        raise InvalidRequest("tools: each tool needs a name and an input_schema object")
    _check_turns(messages)
    parts = [*tools, *system, *messages]
    breakpoints = _breakpoints(parts)
    if len(breakpoints) > MAX_BREAKPOINTS:
        raise InvalidRequest(
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {len(breakpoints)}."
        )
    return model, _neutral(system, messages), parts, breakpoints


def message_response(model: str, reply: Reply, use: CacheUse, output_tokens: int) -> dict[str, Any]:
    """A reply in the Messages API wire format."""
    content: list[dict[str, Any]] = []
    text = reply.refusal if reply.refusal is not None else reply.content
    if text:
        content.append({"type": "text", "text": text})
    for call in reply.tool_calls:
        content.append(
            {
                "type": "tool_use",
                "id": f"toolu_{uuid.uuid4().hex[:24]}",
                "name": call.name,
                "input": _input(call.arguments),
            }
        )
    usage = _usage(reply, use, output_tokens)
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(reply),
        "stop_sequence": None,
        "usage": usage,
    }


def message_events(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A Messages API response as the server-sent events that stream it, in order."""
    usage = message["usage"]
    start_usage = {**usage, "output_tokens": min(1, usage["output_tokens"])}
    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {**message, "content": [], "stop_reason": None, "usage": start_usage},
        },
        {"type": "ping"},
    ]
    for index, block in enumerate(message["content"]):
        events += _block_events(index, block)
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": usage["output_tokens"]},
        }
    )
    events.append({"type": "message_stop"})
    return events


def _block_events(index: int, block: dict[str, Any]) -> list[dict[str, Any]]:
    opened: dict[str, Any] = {"type": "text", "text": ""}
    if block["type"] == "text":
        pieces = [{"type": "text_delta", "text": p} for p in re.findall(r"\s*\S+", block["text"])]
    else:  # tool_use: its input as JSON text in pieces (a text that is not JSON as itself)
        opened = {**block, "input": {}}
        raw = block["input"] if isinstance(block["input"], str) else json.dumps(block["input"])
        pieces = [
            {"type": "input_json_delta", "partial_json": raw[i : i + 16]}
            for i in range(0, len(raw), 16)
        ]
    return [
        {"type": "content_block_start", "index": index, "content_block": opened},
        *({"type": "content_block_delta", "index": index, "delta": p} for p in pieces),
        {"type": "content_block_stop", "index": index},
    ]


def stop_reason(reply: Reply) -> str:
    if reply.stop_reason:
        return reply.stop_reason
    if reply.refusal is not None:
        return "refusal"
    if reply.finish_reason in _STOPS:
        return _STOPS[reply.finish_reason]
    return "tool_use" if reply.tool_calls else "end_turn"


def _usage(reply: Reply, use: CacheUse, output_tokens: int) -> dict[str, int]:
    """Anthropic counts `input_tokens` apart from cache reads and writes."""
    given = reply.usage or {}
    read = given.get("cached_tokens", use.read)
    written = given.get("cache_write_tokens", use.written)
    total = given.get("prompt_tokens", use.total)
    return {
        "input_tokens": max(0, total - read - written),
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": read,
        "output_tokens": given.get("completion_tokens", output_tokens),
    }


def _input(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments  # not JSON: sent as the text itself (a broken tool_use)


def _tool_ok(tool: Any) -> bool:
    return (
        isinstance(tool, dict)
        and isinstance(tool.get("name"), str)
        and isinstance(tool.get("input_schema"), dict)
    )


def _system_blocks(system: Any) -> list[dict[str, Any]]:
    if system is None:
        return []
    if isinstance(system, str):
        return [{"type": "text", "text": system}]
    if isinstance(system, list) and all(_is(b, "text") for b in system):
        return list(system)
    raise InvalidRequest("system: must be a string or a list of text blocks")


def _check_turns(messages: list[Any]) -> None:
    expected, pending = "user", set[str]()
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") != expected:
            raise InvalidRequest(f"messages.{i}: roles must alternate, starting with user")
        blocks = _content(message)
        if expected == "user":
            answered = {b.get("tool_use_id") for b in blocks if _is(b, "tool_result")}
            if pending - answered:
                raise InvalidRequest(
                    f"messages.{i}: tool_use ids were found without tool_result blocks "
                    f"immediately after: {', '.join(sorted(pending - answered))}"
                )
        pending = {str(b.get("id")) for b in blocks if _is(b, "tool_use")}
        expected = "assistant" if expected == "user" else "user"


def _breakpoints(parts: list[Any]) -> list[int]:
    """Prefix lengths ending in a block marked cache_control (a message: its last block)."""
    marks: list[int] = []
    for index, part in enumerate(parts, start=1):
        blocks = _content(part) if "role" in part else [part]
        marks.extend(index for b in blocks if isinstance(b, dict) and "cache_control" in b)
    return marks


def _neutral(system: list[dict[str, Any]], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as OpenAI-style messages, for scenario turns and templates."""
    out: list[dict[str, Any]] = [{"role": "system", "content": b.get("text", "")} for b in system]
    for message in messages:
        blocks = _content(message)
        if message["role"] == "assistant":
            calls = [
                {
                    "id": b.get("id"),
                    "type": "function",
                    "function": {"name": b.get("name"), "arguments": json.dumps(b.get("input"))},
                }
                for b in blocks
                if _is(b, "tool_use")
            ]
            text = "".join(b.get("text", "") for b in blocks if _is(b, "text"))
            out.append({"role": "assistant", "content": text or None, "tool_calls": calls})
            continue
        for block in blocks:
            if _is(block, "tool_result"):
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": block.get("tool_use_id"),
                        "content": _result_text(block.get("content")),
                    }
                )
            elif _is(block, "text"):
                out.append({"role": "user", "content": block.get("text", "")})
    return out


def _content(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _result_text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if _is(b, "text"))
    return content if isinstance(content, str) else ""


def _is(block: Any, kind: str) -> bool:
    return isinstance(block, dict) and block.get("type") == kind
