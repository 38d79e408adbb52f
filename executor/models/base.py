"""The one small interface every model adapter implements."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class ModelReply:
    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    response_id: str = ""
    model: str = ""


class ModelUnavailable(Exception):
    """The provider could not answer now (connection, timeout, 429, 5xx, garbage); try later.

    The message is safe to record in a step: it never holds headers or keys.
    """

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class ModelRejected(Exception):
    """The provider refused the request itself (4xx other than 429); retrying will not help."""

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
    ) -> ModelReply:
        """Ask the model once; raise ModelUnavailable or ModelRejected on failure."""
        ...
