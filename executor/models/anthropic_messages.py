"""The OpenAI-style conversation (executor/transcript.py) as an Anthropic Messages request body.

* `system` messages become the top-level `system` text blocks, in order;
* an assistant message becomes `text` and `tool_use` blocks (arguments parsed
  back to the object they were; text that was never JSON goes as
  `{"arguments_raw": text}` so the model sees what it sent);
* `role: tool` results become `tool_result` blocks of a user message; messages
  of one role in a row merge into one (the API alternates user and assistant);
* tools become `{name, description, input_schema}`.

Prompt caching: `cache_control: {"type": "ephemeral"}` marks the stable prefix
(the last tool definition and the first system block, the agent's
instructions), and the last block of the conversation, so each turn reads the
turns before it from the cache (at most 4 breakpoints are allowed; these are 3).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

EPHEMERAL = {"type": "ephemeral"}


def system_blocks(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The system text blocks; the first one (the instructions) carries the cache mark."""
    blocks: list[dict[str, Any]] = [
        {"type": "text", "text": text}
        for m in messages
        if m.get("role") == "system" and (text := _text(m.get("content")))
    ]
    if blocks:
        blocks[0]["cache_control"] = EPHEMERAL
    return blocks


def conversation(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """User and assistant messages as content blocks, same-role runs merged."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role, blocks = _blocks(message)
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    if out:
        out[-1]["content"][-1]["cache_control"] = EPHEMERAL
    return out


def tools(openai_tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Function tools as Anthropic tools; the last one carries the cache mark."""
    out = []
    for tool in openai_tools:
        function = tool.get("function") or {}
        entry: dict[str, Any] = {
            "name": str(function.get("name") or ""),
            "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
        }
        if function.get("description"):
            entry["description"] = str(function["description"])
        out.append(entry)
    if out:
        out[-1]["cache_control"] = EPHEMERAL
    return out


def tool_choice(choice: str, parallel: bool | None) -> dict[str, Any] | None:
    """`tool_choice` for the version's parameters; None: the API's default (auto)."""
    if not choice and parallel is None:
        return None
    if choice in ("", "auto"):
        out: dict[str, Any] = {"type": "auto"}
    elif choice == "none":
        return {"type": "none"}  # no tool call at all: parallelism is moot
    elif choice == "required":
        out = {"type": "any"}
    else:
        out = {"type": "tool", "name": choice}
    if parallel is False:
        out["disable_parallel_tool_use"] = True
    return out


def _blocks(message: Mapping[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    role = message.get("role")
    if role == "assistant":
        return "assistant", _assistant_blocks(message)
    if role == "tool":
        result = {
            "type": "tool_result",
            "tool_use_id": str(message.get("tool_call_id") or ""),
            "content": _text(message.get("content")),
        }
        return "user", [result]
    if role == "user":
        text = _text(message.get("content"))
        return "user", [{"type": "text", "text": text}] if text else []
    return "system", []  # system text goes to the top-level `system`


def _assistant_blocks(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if text := _text(message.get("content")):
        blocks.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        blocks.append(
            {
                "type": "tool_use",
                "id": str(call.get("id") or ""),
                "name": str(function.get("name") or ""),
                "input": _input(function.get("arguments")),
            }
        )
    return blocks


def _input(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    text = arguments if isinstance(arguments, str) else ""
    if not text.strip():
        return {}
    try:
        parsed = json.loads(text)
    except ValueError:
        return {"arguments_raw": text}
    return parsed if isinstance(parsed, dict) else {"arguments_raw": text}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return "" if content is None else json.dumps(content, ensure_ascii=False)
