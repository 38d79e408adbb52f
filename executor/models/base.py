"""The one small interface every model adapter implements."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ToolCall:
    """A call the model asked for; `arguments` is None when `arguments_raw` was not JSON."""

    id: str
    name: str
    arguments: Mapping[str, Any] | None
    arguments_raw: str | None = None

    def to_payload(self) -> dict[str, Any]:
        """The call as written in a `model_decision` step."""
        entry: dict[str, Any] = {"id": self.id, "name": self.name}
        if self.arguments is None:
            entry["arguments_raw"] = self.arguments_raw or ""
        else:
            entry["arguments"] = dict(self.arguments)
        return entry


@dataclass(frozen=True)
class Usage:
    """What one model call consumed, in the units providers bill.

    `prompt_tokens` is the whole input, cached or not: OpenAI's
    `prompt_tokens`; for Anthropic `input_tokens + cache_read_input_tokens +
    cache_creation_input_tokens` (Anthropic's `input_tokens` counts only the
    uncached rest). `cached_tokens` (read from the provider's prompt cache) and
    `cache_write_tokens` (written to it; Anthropic's cache_creation) are parts
    of it. `reasoning_tokens` (OpenAI `completion_tokens_details`) are part of
    `completion_tokens`; Anthropic reports none apart.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_payload(self) -> dict[str, int]:
        """The `usage` of a `model_decision` step (the control plane prices these keys)."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "cache_write_tokens": self.cache_write_tokens,
        }


# Why a reply ended. COMPLETE: a final answer or tool calls to run; the others are not
# an answer to act on (executor/models/outcome.py decides what becomes of the run).
COMPLETE = "complete"
TRUNCATED = "truncated"  # cut off at max_tokens (or the context window)
FILTERED = "filtered"  # stopped by the provider's content filter
REFUSED = "refused"  # the model declined (OpenAI message.refusal, Anthropic `refusal`)


@dataclass(frozen=True)
class ModelReply:
    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    response_id: str = ""
    model: str = ""
    # COMPLETE, TRUNCATED, FILTERED or REFUSED, and the provider's own word for it
    # (finish_reason / stop_reason) as recorded in the decision step.
    ending: str = COMPLETE
    stop_reason: str = ""
    refusal: str | None = None


@dataclass(frozen=True)
class ModelSettings:
    """How one call is made: the agent version's model profile and parameters.

    None / "" / 0 leave the profile's or the provider's default.
    """

    profile: str = ""
    max_tokens: int = 0
    temperature: float | None = None
    tool_choice: str = ""
    parallel_tool_calls: bool | None = None
    timeout_seconds: float | None = None
    # Fast-path runs: told each piece of the reply's text as the provider streams it (an
    # adapter that cannot stream answers whole and never calls it).
    on_delta: Callable[[str], None] | None = None


DEFAULT_SETTINGS = ModelSettings()


class ModelUnavailable(Exception):
    """The provider could not answer now (connection, timeout, 429, 5xx, garbage); try later.

    The message is safe to record in a step: it never holds headers or keys.
    """

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class ModelRejected(Exception):
    """The provider refused the request itself (a 4xx that is not transient, or a 429
    for an exhausted quota); retrying will not help: the run fails with the reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ModelClient(Protocol):
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
        """Ask the model once; raise ModelUnavailable or ModelRejected on failure.

        `messages` and `tools` are in the OpenAI chat format (executor/replay.py);
        an adapter for another API converts them.
        """
        ...
