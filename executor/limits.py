"""The run's limits (copied at admission): which one the next action would exceed."""

from __future__ import annotations

from agentrun.v1 import run_pb2
from executor.replay import Action, CallModel, Counters, StartTool


def exceeded(run: run_pb2.Run, used: Counters, action: Action, now: float) -> str | None:
    """The failure message if doing `action` now would break a limit, else None.

    `now` is wall-clock seconds; a zero limit means none was set.
    """
    if not isinstance(action, CallModel | StartTool):
        return None
    if run.HasField("deadline_time") and now >= run.deadline_time.ToNanoseconds() / 1e9:
        return f"deadline exceeded ({run.deadline_time.ToJsonString()})"
    limits = run.limits
    if limits.max_tokens and used.tokens >= limits.max_tokens:
        return f"max_tokens exceeded ({limits.max_tokens})"
    if isinstance(action, CallModel) and limits.max_steps and used.model_calls >= limits.max_steps:
        return f"max_steps exceeded ({limits.max_steps})"
    if (
        isinstance(action, StartTool)
        and limits.max_tool_calls
        and used.tool_calls >= limits.max_tool_calls
    ):
        return f"max_tool_calls exceeded ({limits.max_tool_calls})"
    return None
