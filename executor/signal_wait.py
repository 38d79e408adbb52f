"""The `wait_for_signal` internal tool: park until a signal of a name arrives, or a timeout.

The call is committed as started together with a park (wait reason "signal"; wake time the
call's timeout, or none). The control plane writes the signal as the call's result and wakes
the run (control_plane/runs/signals.py), in the park commit's own transaction when the signal came
first. So a run that resumes with the call still open either timed out or was woken early:
the timeout (if any) is then the call's result, else it waits again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentrun.v1 import executor_pb2
from executor import steps
from executor.replay import Entry
from executor.tools.delivery import Outcome

TOOL = "wait_for_signal"
WAIT_REASON = "signal"
# A resumed wait with less left than this has timed out (the executor's clock may differ a
# little from the database's, whose time the started step carries).
CLOCK_TOLERANCE = 1.0


def timeout_of(arguments: Mapping[str, Any]) -> float | None:
    timeout = arguments.get("timeout")
    return float(timeout) if timeout is not None else None


def park(
    seq: int, arguments: Mapping[str, Any], wake_after: float | None
) -> tuple[executor_pb2.NewStep, executor_pb2.Park]:
    """The park step and transition of a wait for the named signal."""
    name = str(arguments.get("name", ""))
    note = f"waiting for signal {name!r}" + (
        f" (at most {wake_after:g}s more)" if wake_after is not None else ""
    )
    return (
        steps.park(seq, WAIT_REASON, wake_after, note),
        steps.park_transition(WAIT_REASON, wake_after),
    )


def remaining(started: Entry, now: float) -> float | None:
    """Seconds the open wait still has before its timeout; None: it has no timeout."""
    timeout = timeout_of(started.payload.get("arguments") or {})
    if timeout is None:
        return None
    began = started.created_at if started.created_at is not None else now
    return began + timeout - now


def timed_out(arguments: Mapping[str, Any]) -> Outcome:
    """The result of a wait whose timeout passed before any signal of its name arrived."""
    return Outcome(
        "ok",
        output={
            "name": arguments.get("name"),
            "timed_out": True,
            "payload": None,
            "timeout": timeout_of(arguments),
        },
    )
