"""The contract canary's executor side: a fixed protocol marker instead of a model call.

`agentrun canary` (control_plane/deploys/canary.py) admits a run of the internal canary
workspace. It travels the whole path every run does — claim, the claim-time
context (assignment, agent version, step log), this boundary, fence admission
of every commit, a tool call's start and result commits, normal completion —
except that its "model" is this module: no provider is touched and no model is
called. The first turn asks for the built-in no-op tool `canary_noop` with the
run's nonce; once the tool's result is in the log, the answer is the marker
with the nonce the tool echoed. Only that exact output passes the canary.
"""

from __future__ import annotations

import re
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, TypeVar

import faults
from executor.models.base import DEFAULT_SETTINGS, ModelReply, ModelSettings, ToolCall

# Shared with control_plane/deploys/canary.py by value (the executor never imports the control plane).
WORKSPACE = "agentrun-internal-canary"
TOOL = "canary_noop"
MARKER = "AGENTRUN-CANARY-OK/v1"
_NONCE = re.compile(r"canary-nonce:([0-9a-f]{32})")
# The fault points a canary run hits: only its own (faults.within).
FAULTS = "executor.canary."
T = TypeVar("T")


def is_canary(workspace_id: str) -> bool:
    return workspace_id == WORKSPACE


async def run(coro: Coroutine[Any, Any, T]) -> T:
    """Drive a canary run: the fault points a test armed for customer runs are inert in
    it (each executor's connect may start a canary), only `executor.canary.*` ones hit."""
    with faults.within(FAULTS):
        return await coro


def answer(nonce: str) -> str:
    """The one output that passes the canary."""
    return f"{MARKER} {nonce}"


def tool_output(arguments: Mapping[str, Any]) -> dict[str, str]:
    """What the no-op tool records: the nonce it was given, echoed."""
    return {"echo": f"canary-nonce:{arguments.get('nonce', '')}"}


def _nonce_in(messages: Sequence[Mapping[str, Any]], role: str) -> str | None:
    for message in messages:
        if message.get("role") == role:
            found = _NONCE.search(str(message.get("content") or ""))
            if found:
                return found.group(1)
    return None


class CanaryModel:
    """A ModelClient that never leaves the process."""

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
        echoed = _nonce_in(messages, "tool")
        if echoed is not None:
            return ModelReply(content=answer(echoed), model=model)
        nonce = _nonce_in(messages, "user") or ""
        call = ToolCall(id=f"canary-{seq}", name=TOOL, arguments={"nonce": nonce})
        return ModelReply(content=None, tool_calls=(call,), model=model)
