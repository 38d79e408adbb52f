"""Scenario files for the model sandbox: loading, turn selection and templating.

A scenario is a scripted model. The request's ``model`` names a file
``<scenarios dir>/<model>.json``::

    {"description": "...", "latency_ms": [min, max],
     "turns": [{"tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}]},
               {"content": "done"}]}

The turn played is the number of assistant messages already in the request
(past the last turn, the last one is played again). Inside a turn:

* ``"{{input}}"`` in any string becomes the text of the first user message,
  ``"{{instructions}}"`` that of the system message (the agent's instructions, so a
  scenario can show which version of an agent ran) and
  ``"{{last_tool_result}}"`` the content of the last tool message (and
  ``"{{last_payload_ref}}"`` the payload its truncated view names);
* ``{"$choice": [a, b]}`` becomes one of its elements (also usable for a whole
  tool call inside ``tool_calls``) and ``{"$nonce": true}`` a fresh 8-hex
  string; ``"{{nonce}}"`` puts a fresh one inside a string.

``$choice`` and ``$nonce`` are random on purpose: asking the same question twice
may get a different answer, so an executor that re-asks a committed decision
shows up as a different decision instead of hiding behind a deterministic mock.
A tool call may give ``"arguments_raw": "<text>"`` to send arguments that are not
valid JSON. ``"summary"`` answers summarisation requests and ``"record_prompts"``
keeps each request's prompt in the log (sandbox/summaries.py).

A turn may also answer the way real providers do when there is no plain answer
(both APIs render it in their own words, sandbox/model_server.py and
sandbox/anthropic_api.py):

* ``"finish_reason": "length" | "content_filter"`` (OpenAI) and ``"stop_reason":
  "max_tokens" | "refusal" | "pause_turn" | ...`` (Anthropic); one given alone
  implies the other (length = max_tokens, content_filter = refusal);
* ``"refusal": "<text>"``: OpenAI ``message.refusal``, Anthropic ``stop_reason
  refusal`` with the text as content;
* ``"usage": {"prompt_tokens", "completion_tokens", "cached_tokens",
  "reasoning_tokens", "cache_write_tokens"}``: any of these instead of the
  server's own count (reasoning tokens are added to the completion);
* ``"error": {"status": 429, "type": "insufficient_quota", "message": "...",
  "headers": {"retry-after-ms": "1500"}}``: an error answer in the API's shape.
"""

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_DIR = Path(__file__).parent / "scenarios"
NONCE = "{{nonce}}"

# Scenario names become file names: no separators, no leading dot.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_ANSWERS = {"content", "refusal", "error"}
_PAYLOAD_REF = re.compile(r'read_result\(ref="([0-9a-f]{64})"')


class UnknownScenario(LookupError):
    """No scenario file with that name."""


class ScenarioError(ValueError):
    """A scenario file that cannot be played."""


@dataclass(frozen=True)
class RenderedCall:
    name: str
    arguments: str  # the JSON text, as the OpenAI API sends it


@dataclass(frozen=True)
class Reply:
    content: str | None
    tool_calls: tuple[RenderedCall, ...]
    finish_reason: str | None = None
    stop_reason: str | None = None
    refusal: str | None = None
    usage: dict[str, int] | None = None
    error: dict[str, Any] | None = None


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    latency_ms: tuple[float, float]
    turns: tuple[dict[str, Any], ...]
    # How it answers a summarisation request, and whether the log keeps prompts
    # (sandbox/summaries.py).
    summary: bool | dict[str, Any] = False
    record_prompts: bool = False

    def turn_index(self, messages: list[dict[str, Any]], recapped: int = 0) -> int:
        """`recapped`: assistant turns a recap in the messages stands for."""
        assistant_messages = sum(1 for m in messages if m.get("role") == "assistant")
        return min(assistant_messages + recapped, len(self.turns) - 1)

    def latency_seconds(self, rng: random.Random) -> float:
        low, high = self.latency_ms
        return rng.uniform(low, high) / 1000.0


def parse_scenario(name: str, data: Any) -> Scenario:
    """Check the shape of a scenario document; raise ScenarioError naming the problem."""
    if not isinstance(data, dict):
        raise ScenarioError(f"scenario {name!r}: expected a JSON object")
    turns = data.get("turns")
    if not isinstance(turns, list) or not turns:
        raise ScenarioError(f"scenario {name!r}: 'turns' must be a non-empty list")
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or not (_ANSWERS & set(turn) or turn.get("tool_calls")):
            raise ScenarioError(
                f"scenario {name!r}: turn {i} needs 'content', 'tool_calls', 'refusal' or 'error'"
            )
    latency = data.get("latency_ms", [0, 0])
    if not (isinstance(latency, list) and len(latency) == 2 and 0 <= latency[0] <= latency[1]):
        raise ScenarioError(f"scenario {name!r}: 'latency_ms' must be [min, max]")
    summary = data.get("summary", False)
    if not isinstance(summary, bool | dict):
        raise ScenarioError(f"scenario {name!r}: 'summary' must be true or {{\"content\": ...}}")
    return Scenario(
        name=name,
        description=str(data.get("description", "")),
        latency_ms=(float(latency[0]), float(latency[1])),
        turns=tuple(turns),
        summary=summary,
        record_prompts=bool(data.get("record_prompts", False)),
    )


class ScenarioStore:
    """Scenario files of one directory or several, parsed once and reloaded when a file
    changes. With several, the first that holds `<name>.json` serves it: `agentrun dev
    --scenarios DIR` puts the user's directory before the built-in one."""

    def __init__(self, directory: Path | Sequence[Path] = DEFAULT_DIR) -> None:
        found = [directory] if isinstance(directory, str | Path) else list(directory)
        self.directories = tuple(Path(d) for d in found) or (DEFAULT_DIR,)
        self._cache: dict[Path, tuple[int, Scenario]] = {}

    @property
    def directory(self) -> Path:
        return self.directories[0]

    def get(self, name: str) -> Scenario:
        if not isinstance(name, str) or not _NAME.match(name):
            raise UnknownScenario(name)
        for directory in self.directories:
            path = directory / f"{name}.json"
            try:
                mtime = path.stat().st_mtime_ns
            except (FileNotFoundError, NotADirectoryError):
                continue
            return self._load(name, path, mtime)
        raise UnknownScenario(name)

    def _load(self, name: str, path: Path, mtime: int) -> Scenario:
        cached = self._cache.get(path)
        if cached and cached[0] == mtime:
            return cached[1]
        scenario = load_file(name, path)
        self._cache[path] = (mtime, scenario)
        return scenario

    def names(self) -> list[str]:
        return sorted(
            {p.stem for d in self.directories for p in d.glob("*.json") if _NAME.match(p.stem)}
        )


def load_file(name: str, path: Path) -> Scenario:
    """One scenario file, checked; ScenarioError names it and what is wrong."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"scenario {name!r}: invalid JSON: {exc}") from None
    return parse_scenario(name, data)


def render_turn(turn: dict[str, Any], messages: list[dict[str, Any]], rng: random.Random) -> Reply:
    """Resolve templates, choices and nonces of one turn against the conversation."""
    fills = {
        "{{input}}": _first_text(messages, "user"),
        "{{instructions}}": _first_text(messages, "system"),
        "{{last_tool_result}}": _last_text(messages, "tool"),
        "{{last_payload_ref}}": payload_ref(_last_text(messages, "tool")),
    }
    rendered = _render(turn, fills, rng)
    content = rendered.get("content")
    if content is not None and not isinstance(content, str):
        content = json.dumps(content)
    calls = tuple(_rendered_call(call) for call in rendered.get("tool_calls") or [])
    return Reply(
        content=content,
        tool_calls=calls,
        finish_reason=_optional_text(rendered, "finish_reason"),
        stop_reason=_optional_text(rendered, "stop_reason"),
        refusal=_optional_text(rendered, "refusal"),
        usage=_usage(rendered.get("usage")),
        error=_error(rendered.get("error")),
    )


def _optional_text(turn: dict[str, Any], key: str) -> str | None:
    value = turn.get(key)
    if value is not None and not isinstance(value, str):
        raise ScenarioError(f"'{key}' must be a string")
    return value


USAGE_KEYS = (
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "reasoning_tokens",
    "cache_write_tokens",
)


def _usage(value: Any) -> dict[str, int] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not set(value) <= set(USAGE_KEYS):
        raise ScenarioError(f"'usage' takes only {', '.join(USAGE_KEYS)}")
    if not all(isinstance(n, int) and n >= 0 for n in value.values()):
        raise ScenarioError("'usage' counts must be non-negative integers")
    return dict(value)


def _error(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("status"), int):
        raise ScenarioError("'error' needs an integer 'status'")
    headers = value.get("headers") or {}
    if not isinstance(headers, dict):
        raise ScenarioError("'error.headers' must be an object")
    return {**value, "headers": {str(k): str(v) for k, v in headers.items()}}


def payload_ref(text: str) -> str:
    """The payload a truncated tool result names (``read_result(ref="<sha256>"``), or ""."""
    found = _PAYLOAD_REF.search(text)
    return found.group(1) if found else ""


def _render(value: Any, fills: dict[str, str], rng: random.Random) -> Any:
    if isinstance(value, str):
        for placeholder, text in fills.items():
            value = value.replace(placeholder, text)
        while NONCE in value:  # a fresh nonce for each occurrence
            value = value.replace(NONCE, _nonce(rng), 1)
        return value
    if isinstance(value, list):
        return [_render(item, fills, rng) for item in value]
    if isinstance(value, dict):
        if set(value) == {"$choice"}:
            options = value["$choice"]
            if not isinstance(options, list) or not options:
                raise ScenarioError("'$choice' needs a non-empty list")
            return _render(rng.choice(options), fills, rng)
        if value == {"$nonce": True}:
            return _nonce(rng)
        return {key: _render(item, fills, rng) for key, item in value.items()}
    return value


def _nonce(rng: random.Random) -> str:
    return f"{rng.getrandbits(32):08x}"


def _rendered_call(call: Any) -> RenderedCall:
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise ScenarioError(f"a tool call needs a 'name': {call!r}")
    if "arguments_raw" in call:
        return RenderedCall(name=call["name"], arguments=str(call["arguments_raw"]))
    return RenderedCall(name=call["name"], arguments=json.dumps(call.get("arguments", {})))


def _message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def _first_text(messages: list[dict[str, Any]], role: str) -> str:
    return next((_message_text(m) for m in messages if m.get("role") == role), "")


def _last_text(messages: list[dict[str, Any]], role: str) -> str:
    return next((_message_text(m) for m in reversed(messages) if m.get("role") == role), "")
