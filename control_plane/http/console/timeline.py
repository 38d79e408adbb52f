"""A run's step log as the timeline shows it: one entry per step, in seq order.

Pure functions of the steps (no I/O), so the page and the live feed render the
same rows. Besides each step's own content the timeline names what the log
implies: an epoch change after a wait is a wake (a new claim); one without a
wait in between is a lease takeover (the previous holder's lease lapsed).
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from control_plane.credits import pricing
from control_plane.store.steps import Step

LABELS = {
    "input": "Input",
    "model_decision": "Model decision",
    "tool_started": "Tool call started",
    "tool_result": "Tool result",
    "park": "Parked",
    "finish": "Finished",
    "approval_requested": "Approval requested",
    "approval_decided": "Approval decided",
}
# Steps after which the run waited (or was decided for while waiting): the next epoch is a wake.
WAITS = {"park", "approval_requested", "approval_decided"}


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def diff(before: Any, after: Any) -> list[tuple[str, str]]:
    """A line diff of two JSON values: (mark, line) with mark '+', '-' or ' '."""
    lines = difflib.ndiff(pretty(before).splitlines(), pretty(after).splitlines())
    return [(line[0], line[2:]) for line in lines if line[:1] in "+- "]


@dataclass
class Entry:
    seq: int
    kind: str
    epoch: int
    ref_seq: int | None
    created_at: datetime
    label: str
    summary: str = ""
    fields: list[tuple[str, str]] = field(default_factory=list)
    code: str = ""  # pretty JSON: arguments, output
    diff: list[tuple[str, str]] = field(default_factory=list)
    note: str = ""  # what the log implies: claimed, woke, lease takeover
    tone: str = ""  # ok | warn | bad
    unknown: bool = False  # a tool result that waits for a person
    resolves: int | None = None  # the unknown outcome this step decides
    took_ms: int | None = None  # since the step before it (None: the first)
    cost: str = ""  # what the step was charged (priced kinds only)


def _decision(e: Entry, p: dict[str, Any]) -> None:
    calls = p.get("tool_calls") or []
    usage = p.get("usage") or {}
    tokens = int(usage.get("prompt_tokens") or 0) + int(usage.get("completion_tokens") or 0)
    e.summary = ", ".join(f"call {c.get('name')}" for c in calls) or "answer"
    e.fields = [("model", str(p.get("model", ""))), ("tokens", str(tokens))]
    if p.get("content"):
        e.fields.append(("says", str(p["content"])))
    if calls:
        e.code = pretty([{"name": c.get("name"), "arguments": c.get("arguments")} for c in calls])


def _started(e: Entry, p: dict[str, Any]) -> None:
    e.summary = str(p.get("tool", ""))
    e.fields = [("key", str(p.get("idempotency_key", ""))), ("class", str(p.get("class", "")))]
    e.code = pretty(p.get("arguments"))


def _result(e: Entry, p: dict[str, Any]) -> None:
    status = str(p.get("status", ""))
    e.summary = f"{p.get('tool', '')}: {status}"
    e.tone = {"ok": "ok", "error": "bad"}.get(status, "warn")
    if p.get("awaiting") == "human" and "decision" not in p:
        e.unknown = True
        e.note = "unknown outcome: waits for a person to decide"
    if "decision" in p:
        e.resolves = e.ref_seq
        e.fields.append(("decided", f"{p['decision']} by {p.get('decided_by', '')}"))
        if p.get("note"):
            e.fields.append(("note", str(p["note"])))
    for name in ("error", "resolution"):
        if p.get(name):
            e.fields.append((name, str(p[name])))
    if p.get("output") is not None:
        e.code = pretty(p["output"])


def _approval(e: Entry, p: dict[str, Any]) -> None:
    e.summary = str(p.get("tool", ""))
    if e.kind == "approval_requested":
        e.code = pretty(p.get("arguments"))
        e.tone = "warn"
        return
    e.summary += f": {p.get('decision', '')} by {p.get('decided_by', '')} ({p.get('via', '')})"
    e.tone = "bad" if p.get("decision") in ("rejected", "expired") else "ok"
    if p.get("reason"):
        e.fields.append(("reason", str(p["reason"])))
    if "edited_from" in p:
        e.diff = diff(p["edited_from"], p.get("arguments"))
    else:
        e.code = pretty(p.get("arguments"))


def _other(e: Entry, p: dict[str, Any]) -> None:
    if e.kind == "input":
        e.summary = str(p.get("text", ""))
    elif e.kind == "park":
        e.summary = f"waiting: {p.get('wait_reason', '')}"
        if "wake_after_seconds" in p:
            e.fields.append(("wakes after", f"{float(p['wake_after_seconds']):g} s"))
        if p.get("note"):
            e.fields.append(("note", str(p["note"])))
        e.tone = "warn"
    elif e.kind == "finish":
        e.summary = str(p.get("status", ""))
        e.tone = "ok" if p.get("status") == "completed" else "bad"
        text = p.get("output") if p.get("status") == "completed" else p.get("error")
        e.fields.append(("output" if p.get("status") == "completed" else "error", str(text)))
        refused = p.get("refused_calls") or []
        if refused:  # completed, but not silently: constraints refused calls on the way
            e.tone = "warn"
            e.summary += f", {len(refused)} call(s) refused"
            steps = ", ".join(
                f"{r.get('rule')} on {r.get('tool')} (step {r.get('seq')})" for r in refused
            )
            e.fields.append(("refused", steps))
    else:
        e.code = pretty(p)


FILL = {
    "model_decision": _decision,
    "tool_started": _started,
    "tool_result": _result,
    "approval_requested": _approval,
    "approval_decided": _approval,
}


def implied(previous: Step | None, step: Step) -> str:
    """What an epoch change says (empty when the epoch did not change)."""
    if previous is None or step.epoch <= previous.epoch or step.epoch == 0:
        return ""
    if previous.kind == "input":
        return f"claimed by an executor (epoch {step.epoch})"
    if previous.kind in WAITS or '"decision"' in previous.payload:
        return f"woke and claimed again (epoch {step.epoch})"
    return f"lease takeover: epoch {previous.epoch} lapsed, now epoch {step.epoch}"


def entry(step: Step, previous: Step | None = None) -> Entry:
    e = Entry(
        step.seq,
        step.kind,
        step.epoch,
        step.ref_seq,
        step.created_at,
        LABELS.get(step.kind, step.kind),
    )
    try:
        payload = json.loads(step.payload)
    except ValueError:
        payload = {}
    payload = payload if isinstance(payload, dict) else {}
    FILL.get(step.kind, _other)(e, payload)
    if previous is not None:
        e.took_ms = round((step.created_at - previous.created_at).total_seconds() * 1000)
    if step.kind in pricing.PRICED_KINDS:
        try:
            used = pricing.step_usage(pricing.table(), step.kind, payload, f"step {step.seq}")
        except (ValueError, KeyError):  # a malformed record: shown, not priced
            used = None
        if used is not None:
            e.cost = f"${used.cost_micros / 1_000_000:.4f}"
            if step.kind == "model_decision":
                e.fields.append(("in · out", f"{used.input_tokens} · {used.output_tokens}"))
    e.note = " · ".join(n for n in (implied(previous, step), e.note) if n)
    return e


def entries(steps: list[Step]) -> list[Entry]:
    """Every step's entry; an unknown outcome already decided shows no decision form."""
    out: list[Entry] = []
    for i, step in enumerate(steps):
        out.append(entry(step, steps[i - 1] if i else None))
    decided = {e.resolves for e in out if e.resolves is not None}
    for e in out:
        e.unknown = e.unknown and e.seq not in decided
    return out
