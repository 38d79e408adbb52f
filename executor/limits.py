"""The run's limits (copied at admission): which one the next action would exceed."""

from __future__ import annotations

from google.protobuf import duration_pb2

from agentrun.v1 import run_pb2
from executor.replay import Action, CallModel, Counters, StartTool


def exceeded(
    run: run_pb2.Run, used: Counters, action: Action, now: float, held_for: float = 0.0
) -> str | None:
    """The failure message if doing `action` now would break a limit, else None.

    `now` is wall-clock seconds (for the max age); `held_for` is how long this
    executor has held the run, added to the active time of its earlier holds
    (`run.active_duration` at the claim) for the deadline. A zero limit means
    none was set.
    """
    if not isinstance(action, CallModel | StartTool):
        return None
    limits = run.limits
    deadline = seconds_of(limits.deadline)
    active = seconds_of(run.active_duration) + held_for
    if deadline and active >= deadline:
        return f"deadline exceeded ({active:.1f}s of active time; the limit is {deadline:g}s)"
    if run.HasField("expire_time") and now >= run.expire_time.ToNanoseconds() / 1e9:
        return f"max age exceeded ({run.expire_time.ToJsonString()})"
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


def seconds_of(duration: duration_pb2.Duration) -> float:
    """`duration.ToTimedelta().total_seconds()` exactly (whole microseconds, nanoseconds
    cut toward zero), without building the timedelta on every check of every action."""
    nanos = duration.nanos
    micros = nanos // 1000 if nanos >= 0 else -(-nanos // 1000)
    return (duration.seconds * 1_000_000 + micros) / 1_000_000
