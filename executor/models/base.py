"""The one small interface every model adapter implements."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from executor import storable


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
    # How long the call took, as the run loop timed it (recorded in the step: /metrics'
    # step durations); None from the adapters, set by executor/model_turn.py.
    duration_ms: int | None = None


def kept(reply: ModelReply) -> ModelReply:
    """`reply` with its text as the control plane can keep it (executor/storable.py): every
    adapter's reply goes through here, so no NUL or lone surrogate from a provider reaches
    a step, a Commit's fields or a stream message."""
    text = storable.text
    calls = tuple(
        ToolCall(
            text(c.id),
            text(c.name),
            None if c.arguments is None else storable.value(c.arguments),
            None if c.arguments_raw is None else text(c.arguments_raw),
        )
        for c in reply.tool_calls
    )
    return dataclasses.replace(
        reply,
        content=None if reply.content is None else text(reply.content),
        tool_calls=calls,
        response_id=text(reply.response_id),
        model=text(reply.model),
        stop_reason=text(reply.stop_reason),
        refusal=None if reply.refusal is None else text(reply.refusal),
    )


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
    # Streamed calls (executor/deltas.py): told each piece of the reply's text as the
    # provider streams it (an adapter that cannot stream answers whole and never calls it).
    on_delta: Callable[[str], None] | None = None


DEFAULT_SETTINGS = ModelSettings()


class ModelUnavailable(Exception):
    """The provider could not answer now (connection, timeout, 429, 5xx, garbage); try later.

    The message is safe to record in a step: it never holds headers or keys.
    """

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        reason = storable.text(reason)  # it may quote the provider (executor/storable.py)
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


# What reading a provider's body raises when a part of it is not the shape the adapter
# reads: a number where a list was, a string where an object was, a list index past
# its end, a count that is not a number.
GARBLED = (TypeError, ValueError, KeyError, IndexError, AttributeError)


@contextlib.contextmanager
def garbled_is_unavailable(what: str) -> Iterator[None]:
    """Read a provider's answer inside: a shape the adapter's own checks did not foresee
    is the provider's garbled answer (ModelUnavailable: ask again later), never an
    exception that ends the run's task. A run whose task ends that way keeps its lease
    until it lapses, and the executor that takes it over asks again and fails the same
    way, until the run's deadline. The reason names the exception's class only: its text
    quotes the provider's body."""
    try:
        yield
    except GARBLED as exc:
        raise ModelUnavailable(
            f"invalid {what} from model provider: unreadable ({type(exc).__name__})"
        ) from exc


class ModelRejected(Exception):
    """The provider refused the request itself (a 4xx that is not transient, or a 429
    for an exhausted quota); retrying will not help: the run fails with the reason."""

    def __init__(self, reason: str) -> None:
        reason = storable.text(reason)  # it may quote the provider (executor/storable.py)
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

        `messages` and `tools` are in the OpenAI chat format (executor/transcript.py);
        an adapter for another API converts them.
        """
        ...
