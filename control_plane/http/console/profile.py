"""A run's step log read as a profile: the model and tool calls with their latency, tokens
and cost, each epoch with its release and executor, and the totals.

Pure functions of the steps (no I/O). The log records when each step was committed
(`created_at`), not when work began, so a call's time is read from the log:

* a model call runs from the step before its `model_decision` to the decision;
* a tool call runs from its `tool_started` to the `tool_result` with the same call id
  (still running when there is none yet).

Cost is what the server's price table (control_plane/credits/pricing.py) charges for
the step, as the commit that wrote it was charged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from control_plane.credits import pricing
from control_plane.http.console.timeline import implied
from control_plane.store.steps import Step, Usage


@dataclass
class Call:
    """One bar of the waterfall."""

    kind: str  # model | tool
    seq: int  # the decision's seq, or the tool_started's
    end_seq: int | None  # the step that ended it (None: still running)
    name: str  # the model, or the tool
    start: datetime = datetime.min
    end: datetime | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_micros: int = 0
    status: str = ""  # a tool's result status
    after_wait: bool = False  # a model call right after a claim: its time includes the wait
    # Where the bar sits, in thousandths of the run's span (SVG viewBox units).
    x: int = 0
    width: int = 0

    @property
    def ms(self) -> int | None:
        return None if self.end is None else round((self.end - self.start).total_seconds() * 1000)


@dataclass
class Epoch:
    epoch: int
    first_seq: int
    last_seq: int
    start: datetime
    end: datetime
    releases: list[str] = field(default_factory=list)
    executor: str = ""  # known for the lease held now only: earlier holders are not recorded
    how: str = ""  # claimed, woke, lease takeover


@dataclass
class Profile:
    calls: list[Call]
    epochs: list[Epoch]
    took_ms: dict[int, int]  # seq -> ms since the step before it
    usage: dict[int, Usage]  # seq -> what the step cost
    total: Usage
    span_ms: int
    model_ms: int
    tool_ms: int


def _payload(step: Step) -> dict[str, Any]:
    try:
        value = json.loads(step.payload)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _usage(prices: pricing.PriceTable, step: Step, payload: dict[str, Any]) -> Usage:
    if step.kind not in pricing.PRICED_KINDS:
        return Usage()
    try:
        return pricing.step_usage(prices, step.kind, payload, f"step {step.seq}")
    except (ValueError, KeyError):  # a malformed record: shown, not priced
        return Usage()


def _ms(a: datetime, b: datetime) -> int:
    return round((b - a).total_seconds() * 1000)


def _calls(steps: list[Step], usage: dict[int, Usage]) -> list[Call]:
    calls: list[Call] = []
    open_tools: dict[str, Call] = {}
    for previous, step in zip([None, *steps], steps, strict=False):
        p, used = _payload(step), usage[step.seq]
        if step.kind == "model_decision" and previous is not None:
            call = Call("model", previous.seq, step.seq, str(p.get("model", "")))
            call.start, call.end = previous.created_at, step.created_at
            call.input_tokens, call.output_tokens = used.input_tokens, used.output_tokens
            call.cost_micros, call.after_wait = used.cost_micros, previous.epoch != step.epoch
            calls.append(call)
        elif step.kind == "tool_started":
            call = Call("tool", step.seq, None, str(p.get("tool", "")), step.created_at)
            call.cost_micros = used.cost_micros
            calls.append(call)
            open_tools[str(p.get("call_id", step.seq))] = call
        elif step.kind == "tool_result":
            started = open_tools.pop(str(p.get("call_id", "")), None)
            if started is not None:
                started.end, started.end_seq = step.created_at, step.seq
                started.status = str(p.get("status", ""))
    return calls


def _epochs(steps: list[Step], lease_epoch: int, lease_owner: str | None) -> list[Epoch]:
    epochs: list[Epoch] = []
    for previous, step in zip([None, *steps], steps, strict=False):
        if step.epoch <= 0:
            continue
        if epochs and epochs[-1].epoch == step.epoch:
            e = epochs[-1]
            e.last_seq, e.end = step.seq, step.created_at
        else:
            e = Epoch(step.epoch, step.seq, step.seq, step.created_at, step.created_at)
            e.how = implied(previous, step)
            e.executor = lease_owner or "" if step.epoch == lease_epoch else ""
            epochs.append(e)
        if step.release and step.release not in e.releases:
            e.releases.append(step.release)
    return epochs


def profile(
    steps: list[Step],
    lease_epoch: int = 0,
    lease_owner: str | None = None,
    prices: pricing.PriceTable | None = None,
) -> Profile:
    prices = prices or pricing.table()
    usage = {step.seq: _usage(prices, step, _payload(step)) for step in steps}
    took = {s.seq: _ms(p.created_at, s.created_at) for p, s in zip(steps, steps[1:], strict=False)}
    calls = _calls(steps, usage)
    span_ms = _ms(steps[0].created_at, steps[-1].created_at) if steps else 0
    if steps:  # each bar's place, in thousandths of the span
        origin, last, scale = steps[0].created_at, steps[-1].created_at, 1000 / max(span_ms, 1)
        for c in calls:
            c.x = min(round(_ms(origin, c.start) * scale), 999)
            c.width = max(round(_ms(c.start, c.end or last) * scale), 1)
    return Profile(
        calls=calls,
        epochs=_epochs(steps, lease_epoch, lease_owner),
        took_ms=took,
        usage=usage,
        total=sum(usage.values(), Usage()),
        span_ms=span_ms,
        model_ms=sum(c.ms or 0 for c in calls if c.kind == "model"),
        tool_ms=sum(c.ms or 0 for c in calls if c.kind == "tool"),
    )


def seconds(ms: int | None) -> str:
    """A duration for people: 850 ms, 1.25 s, 3 min 20 s."""
    if ms is None:
        return "running"
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.2f} s"
    return f"{ms // 60_000} min {(ms % 60_000) // 1000} s"


def dollars(micros: int) -> str:
    return f"${micros / 1_000_000:.4f}" if micros else "$0"
