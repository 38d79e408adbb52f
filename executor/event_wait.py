"""The `wait_for_event` internal tool: park until a published event matches, or a timeout.

Arguments: `name` and `match` (one event), or `events` (a list of {name, match}) with
`mode` "any" (the first to arrive, the default) or "all" (every one of them); `timeout` in
seconds; `lookback` in seconds: events published that long before the call are caught too.

The run side of each match expression is read from the run's input here, when the wait
starts (ground/event_match.py), and the park step carries the concrete keys; the control
plane indexes them in the park commit's transaction and writes the event(s) as the call's
result when they come (control_plane/runs/events.py). A call whose expression does not
parse, or whose run side the input cannot supply, is answered at once with an error the
model reads. A run that resumes with the call still open either timed out or was woken
early (then it waits again), as a signal wait does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentrun.v1 import executor_pb2
from executor import steps
from executor.replay import Entry
from executor.signal_wait import CLOCK_TOLERANCE, remaining, timeout_of
from executor.tools.delivery import Outcome
from ground import event_match

TOOL = "wait_for_event"
WAIT_REASON = "event"
PARK_FIELD = "event_wait"  # control_plane/runs/events.py reads it
MAX_EVENTS = 10
MAX_LOOKBACK = 30 * 86400
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z")

__all__ = ["CLOCK_TOLERANCE", "TOOL", "WAIT_REASON", "Wait", "remaining", "timeout_of"]


@dataclass(frozen=True)
class Wait:
    mode: str
    slots: list[dict[str, Any]]  # {"name", "key"}
    lookback: float


def run_input(entries: list[Entry]) -> Any:
    """The run's input as JSON (None when it is not JSON)."""
    first = entries[0].payload if entries else {}
    return event_match.run_input(str(first.get("text", "")))


def wait_of(arguments: Mapping[str, Any], run_input_value: Any) -> Wait:
    """The call's wait, keys bound (ValueError says what is wrong with the arguments)."""
    if "events" in arguments:
        wanted = arguments["events"]
        if not isinstance(wanted, list) or not 1 <= len(wanted) <= MAX_EVENTS:
            raise ValueError(f"events must be a list of 1 to {MAX_EVENTS} {{name, match}}")
    else:
        wanted = [{"name": arguments.get("name"), "match": arguments.get("match", "")}]
    mode = arguments.get("mode", "any")
    if mode not in ("any", "all"):
        raise ValueError("mode must be 'any' or 'all'")
    lookback = arguments.get("lookback", 0) or 0
    if not isinstance(lookback, int | float) or not 0 <= lookback <= MAX_LOOKBACK:
        raise ValueError(f"lookback must be 0 to {MAX_LOOKBACK} seconds")
    slots = []
    for i, one in enumerate(wanted):
        where = f"events[{i}]" if "events" in arguments else ""
        if not isinstance(one, Mapping):
            raise ValueError(f"{where} must be an object {{name, match}}")
        name = one.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise ValueError(f"{where}name must be an event name (letters, digits, '._:-')")
        match = one.get("match", "") or ""
        if not isinstance(match, str):
            raise ValueError(f"{where}match must be a string")
        try:
            key = event_match.bind(event_match.parse(match), run_input_value)
        except event_match.ExpressionError as exc:
            raise ValueError(f"{where}match: {exc}") from None
        slots.append({"name": name, "key": key})
    return Wait(str(mode), slots, float(lookback))


def park(
    seq: int, call_seq: int, wait: Wait, wake_after: float | None
) -> tuple[executor_pb2.NewStep, executor_pb2.Park]:
    """The park step (with the wait's keys) and transition of a wait for events."""
    names = ", ".join(repr(s["name"]) for s in wait.slots)
    note = f"waiting for {'all of ' if wait.mode == 'all' else ''}event {names}" + (
        f" (at most {wake_after:g}s more)" if wake_after is not None else ""
    )
    extra = {
        PARK_FIELD: {
            "call_seq": call_seq,
            "slots": wait.slots,
            "mode": wait.mode,
            "lookback_seconds": wait.lookback,
        }
    }
    return (
        steps.park(seq, WAIT_REASON, wake_after, note, extra),
        steps.park_transition(WAIT_REASON, wake_after),
    )


def timed_out(arguments: Mapping[str, Any]) -> Outcome:
    """The result of a wait whose timeout passed before its event(s) came."""
    return Outcome(
        "ok",
        output={"timed_out": True, "events": [], "body": None, "timeout": timeout_of(arguments)},
    )
