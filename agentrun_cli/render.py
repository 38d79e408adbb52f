"""Turn runs, steps and agents (proto messages) into readable lines or JSON; pure functions."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from google.protobuf import json_format, timestamp_pb2
from google.protobuf.message import Message

from agentrun.v1 import agent_pb2, run_pb2

SHORT = 80


def status_name(status: int) -> str:
    """`RUN_STATUS_WAITING` -> `waiting`."""
    return _enum_name(run_pb2.RunStatus, status, "RUN_STATUS_")


def kind_name(kind: int) -> str:
    """`STEP_KIND_TOOL_STARTED` -> `tool_started`."""
    return _enum_name(run_pb2.StepKind, kind, "STEP_KIND_")


def status_value(name: str) -> int:
    """`waiting` -> `RUN_STATUS_WAITING` (the inverse of status_name)."""
    return run_pb2.RunStatus.Value("RUN_STATUS_" + name.upper())


def _enum_name(enum: Any, value: int, prefix: str) -> str:
    try:
        return enum.Name(value).removeprefix(prefix).lower()
    except ValueError:
        return str(value)


def timestamp(ts: timestamp_pb2.Timestamp) -> str:
    """A set timestamp as `2025-01-02T03:04:05Z`; an unset one as `-`."""
    if not ts.seconds and not ts.nanos:
        return "-"
    return ts.ToDatetime(tzinfo=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def duration(seconds: float | None) -> str:
    """`850ms`, `12.3s`, `4m05s`, `2h03m`, `3d04h`; `-` for None."""
    if seconds is None or seconds < 0:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def elapsed(run: run_pb2.Run, now: datetime | None = None) -> float | None:
    """Wall time from admission to the end (or to `now` while the run goes on)."""
    if not run.HasField("create_time"):
        return None
    start = run.create_time.ToDatetime(tzinfo=UTC)
    if run.HasField("finish_time"):
        end = run.finish_time.ToDatetime(tzinfo=UTC)
    else:
        end = now or datetime.now(UTC)
    return (end - start).total_seconds()


def active(run: run_pb2.Run) -> float | None:
    """Active time: what executors held the run (None when the server did not say)."""
    if not run.HasField("active_duration"):
        return None
    return run.active_duration.ToTimedelta().total_seconds()


def tokens(count: int) -> str:
    """`950`, `12.4k`, `3.1M`."""
    if count < 1000:
        return str(count)
    if count < 1_000_000:
        return f"{count / 1000:.1f}k"
    return f"{count / 1_000_000:.1f}M"


def short(value: Any, limit: int = SHORT) -> str:
    """Compact JSON (or the string itself, quoted) cut to `limit` characters."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def payload(step: run_pb2.Step) -> dict[str, Any] | None:
    """The step's payload as a dict, or None when it is not a JSON object."""
    try:
        value = json.loads(step.payload_json or "{}")
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# --- steps -----------------------------------------------------------------


def _input(p: dict[str, Any]) -> str:
    return short(p.get("text", ""))


def _call(call: dict[str, Any]) -> str:
    args = call["arguments"] if "arguments" in call else call.get("arguments_raw")
    return f"{call.get('name', '?')}({short(args, 40)})"


def _decision(p: dict[str, Any]) -> str:
    parts = []
    if p.get("content"):
        parts.append("says " + short(p["content"], 60))
    calls = p.get("tool_calls") or []
    if calls:
        parts.append("calls " + ", ".join(_call(c) for c in calls))
    if p.get("ending"):  # no answer: cut off, filtered or refused (the run failed)
        parts.append(f"{p['ending']} ({p.get('stop_reason') or '?'})")
    usage = p.get("usage") or {}
    extra = "".join(
        f", {usage[key]} {label}"
        for key, label in (
            ("cached_tokens", "cached"),
            ("cache_write_tokens", "cache written"),
            ("reasoning_tokens", "reasoning"),
        )
        if usage.get(key)
    )
    tokens = f"[{usage.get('prompt_tokens', 0)}+{usage.get('completion_tokens', 0)} tokens{extra}]"
    return "; ".join(parts or ["(empty)"]) + " " + tokens


def _tool_started(p: dict[str, Any]) -> str:
    line = f"{p.get('tool', '?')} {short(p.get('arguments'), 60)} key={p.get('idempotency_key')}"
    return line + (f" class={p['class']}" if p.get("class") else "")


def _tool_result(p: dict[str, Any]) -> str:
    status = p.get("status", "?")
    line = f"{p.get('tool', '?')} {status}"
    if status == "error":
        line += f": {p.get('error', '')}"
    elif "output" in p:
        line += " " + short(p["output"], 60)
    if p.get("resolution"):
        line += f" (resolved: {p['resolution']})"
    return line


def _park(p: dict[str, Any]) -> str:
    line = p.get("wait_reason", "?")
    if p.get("wake_after_seconds") is not None:
        line += f" for {p['wake_after_seconds']:g}s"
    return line + (f": {p['note']}" if p.get("note") else "")


def _finish(p: dict[str, Any]) -> str:
    if p.get("error"):
        return f"{p.get('status', '?')}: {p['error']}"
    line = f"{p.get('status', '?')} {short(p.get('output', ''))}"
    refused = p.get("refused_calls") or []
    if refused:
        rules = ", ".join(sorted({f"{r.get('rule')} on {r.get('tool')}" for r in refused}))
        line += f" ({len(refused)} call(s) refused by constraints: {rules})"
    return line


def _approval_requested(p: dict[str, Any]) -> str:
    return (
        f"{p.get('tool', '?')} {short(p.get('arguments'), 60)} "
        f"sha256={str(p.get('arguments_sha256', ''))[:12]}… approval={p.get('approval_id')}"
    )


def _approval_decided(p: dict[str, Any]) -> str:
    line = f"{p.get('decision', '?')} by {p.get('decided_by', '?')} via {p.get('via', '?')}"
    if p.get("reason"):
        line += f": {p['reason']}"
    if p.get("decision") == "edited":
        line += f"; runs {short(p.get('arguments'), 60)}"
    return line


def _summary(p: dict[str, Any]) -> str:
    usage = p.get("usage") or {}
    tokens = f"[{usage.get('prompt_tokens', 0)}+{usage.get('completion_tokens', 0)} tokens]"
    span = f"recap of steps {p.get('from_seq', '?')}-{p.get('through_seq', '?')}"
    return f"{span}: {short(p.get('text', ''), 60)} {tokens}"


_SUMMARIES: dict[int, Callable[[dict[str, Any]], str]] = {
    run_pb2.STEP_KIND_INPUT: _input,
    run_pb2.STEP_KIND_MODEL_DECISION: _decision,
    run_pb2.STEP_KIND_TOOL_STARTED: _tool_started,
    run_pb2.STEP_KIND_TOOL_RESULT: _tool_result,
    run_pb2.STEP_KIND_PARK: _park,
    run_pb2.STEP_KIND_FINISH: _finish,
    run_pb2.STEP_KIND_APPROVAL_REQUESTED: _approval_requested,
    run_pb2.STEP_KIND_APPROVAL_DECIDED: _approval_decided,
    run_pb2.STEP_KIND_SUMMARY: _summary,
}


def step_summary(step: run_pb2.Step) -> str:
    """What a step says, in a few words; the raw payload when its shape is unexpected."""
    p = payload(step)
    summarize = _SUMMARIES.get(step.kind)
    if p is None or summarize is None:
        return short(step.payload_json)
    try:
        return summarize(p)
    except (KeyError, TypeError, ValueError, AttributeError):
        return short(step.payload_json)


def step_line(step: run_pb2.Step) -> str:
    """`seq kind summary`, the form `runs watch` prints."""
    return f"{step.seq} {kind_name(step.kind)} {step_summary(step)}"


def step_row(step: run_pb2.Step) -> str:
    """One row of a step table: seq, kind, epoch, short payload."""
    return f"{step.seq:>4}  {kind_name(step.kind):<18} e{step.epoch:<3} {step_summary(step)}"


def step_table(steps: Iterable[run_pb2.Step]) -> list[str]:
    """The whole step log as a header and one row per step."""
    return [f"{'seq':>4}  {'kind':<18} {'epoch':<4} summary"] + [step_row(s) for s in steps]


# --- runs ------------------------------------------------------------------


def state_line(run: run_pb2.Run) -> str:
    """`status: waiting (sleep) until …`, the form `runs watch` prints for state changes."""
    line = f"status: {status_name(run.status)}" + (" [paused]" if run.paused else "")
    if run.status == run_pb2.RUN_STATUS_WAITING:
        line += f" ({run.wait_reason or '?'})"
        if run.wait_reason == "concurrency_key":
            line += f" for a slot of key {run.concurrency_key!r}"
        else:
            line += (
                f" until {timestamp(run.wake_time)}" if run.HasField("wake_time") else " on event"
            )
    elif run.status == run_pb2.RUN_STATUS_RUNNING:
        line += f" on {run.lease_owner or '?'} epoch {run.lease_epoch}"
        line += f" attempt {run.attempt}" if run.attempt else ""
    elif run.error:
        line += f": {run.error}"
    if note := refusal_note(run):
        line += f" ({note})"
    return line


def refusal_note(run: run_pb2.Run) -> str:
    """What constraints' refusals did to a finished run (issue 48), or "": a run that
    completed regardless never reads as a plain success."""
    n = run.counters.refused_calls
    if run.outcome == run_pb2.RUN_OUTCOME_ONLY_REFUSED:
        return f"only refused: its {n} call(s) were all refused by constraints, none ran"
    if n and run.outcome != run_pb2.RUN_OUTCOME_UNSPECIFIED:
        return f"{n} call(s) refused by constraints"
    return ""


def status_label(run: run_pb2.Run) -> str:
    """`runs list`'s status: the status, with a finished run's refused calls."""
    if run.outcome == run_pb2.RUN_OUTCOME_ONLY_REFUSED:
        return "only refused"
    name = status_name(run.status)
    if run.counters.refused_calls and run.outcome != run_pb2.RUN_OUTCOME_UNSPECIFIED:
        return f"{name}, {run.counters.refused_calls} refused"
    return name


def release_line(run: run_pb2.Run) -> str:
    """The run's release, and that it waits for one of its executors when none is there."""
    if run.queue.cause == run_pb2.QUEUE_WAIT_CAUSE_RELEASE_UNAVAILABLE:
        return f"{run.release}: no executor of it connected (move: agentrun releases move)"
    return run.release or "-"


def run_summary(run: run_pb2.Run) -> list[str]:
    """A run's state as aligned `field  value` lines."""
    c = run.counters
    rows = [
        ("run", run.run_id),
        ("agent", f"{run.agent_id} v{run.agent_version}"),
        ("state", state_line(run).removeprefix("status: ")),
        ("input", short(run.input)),
        ("output", short(run.output) if run.output else "-"),
        ("error", run.error or "-"),
        (
            "counters",
            f"{c.steps} steps, {c.model_calls} model calls, "
            f"{c.tool_calls} tool calls, {c.tokens} tokens",
        ),
        ("time", f"{duration(elapsed(run))} elapsed, {duration(active(run))} active"),
        (
            "usage",
            f"{c.input_tokens} in ({c.cached_tokens} cached), {c.output_tokens} out "
            f"({c.reasoning_tokens} reasoning)",
        ),
        ("cost", cost_line(run)),
        ("lease", f"epoch {run.lease_epoch}, attempt {run.attempt}"),
        ("priority", str(run.priority)),
        ("release", release_line(run)),
        ("created", timestamp(run.create_time)),
        ("finished", timestamp(run.finish_time)),
    ]
    if run.parent_run_id:
        call = "start_child"
        if run.HasField("parent_index"):
            call = f"start_children, entry {run.parent_index},"
        rows.append(("parent", f"{run.parent_run_id} (its {call} at step {run.parent_seq})"))
        if run.parent_close:
            rows.append(("close", f"{run.parent_close}, when its parent ends"))
    if run.child_run_ids:
        rows.append(("children", ", ".join(run.child_run_ids)))
    if run.tags:
        rows.append(("tags", ", ".join(run.tags)))
    if run.metadata_json not in ("", "{}"):
        rows.append(("metadata", short(run.metadata_json)))
    return [f"{name:<9} {value}" for name, value in rows]


def cost_line(run: run_pb2.Run) -> str:
    """The run's cost in credits, and what it reserved when its workspace is metered."""
    cost = f"{Decimal(run.counters.cost_micros) / 1_000_000:f} credits"
    if not run.credit_chunks:
        return cost
    reserved = Decimal(run.credits_reserved_micros) / 1_000_000
    return f"{cost} (reserved {reserved:f} in {run.credit_chunks} chunks)"


def run_row(run: run_pb2.Run) -> str:
    """One line of `runs list`: id, agent@version, status, created, counters."""
    return (
        f"{run.run_id:<36} {run.agent_id + '@' + str(run.agent_version):<24} "
        f"{status_name(run.status):<10} {timestamp(run.create_time)}  "
        f"{run.counters.steps} steps"
    )


def event_lines(events: Iterable[run_pb2.WatchRunResponse]) -> Iterator[str]:
    """Lines for a WatchRun stream; a state line repeated (e.g. after a reconnect) is dropped."""
    last_state = None
    for event in events:
        if event.HasField("step"):
            yield step_line(event.step)
        elif event.HasField("run"):
            line = state_line(event.run)
            if line != last_state:
                yield line
            last_state = line


# --- agents ----------------------------------------------------------------


def agent_lines(agent: agent_pb2.Agent, version: agent_pb2.AgentVersion | None) -> list[str]:
    """An agent and (when one is published) its latest version's spec."""
    lines = [
        f"agent     {agent.agent_id} ({agent.display_name or 'no name'})",
        f"latest    v{agent.latest_version}" if agent.latest_version else "latest    -",
        f"created   {timestamp(agent.create_time)}",
    ]
    if version is not None:
        spec = version.spec
        lines += [
            f"model     {spec.model or '-'}"
            + (f" (profile {spec.model_profile})" if spec.model_profile else ""),
            f"tools     {', '.join(spec.tools) or '-'}",
            f"limits    max_steps={spec.limits.max_steps or 'default'} "
            f"deadline={_seconds(spec.limits) or 'default'}",
            *_policy_lines(spec),
            f"instructions {short(spec.instructions)}",
        ]
    return lines


def _policy_lines(spec: agent_pb2.AgentSpec) -> list[str]:
    """Approvals, the agent's cap, constraints and connections, when the spec has them."""
    lines = []
    pol = spec.approval
    if pol.tools or pol.approvers or pol.high_risk_tools:
        held = ", ".join([*pol.tools, *pol.high_risk_tools]) or "catalogue defaults"
        lines.append(
            f"approval  {held} by {', '.join(pol.approvers) or '-'}"
            + (" (four eyes)" if pol.four_eyes else "")
        )
    if spec.max_concurrency:
        lines.append(f"cap       {spec.max_concurrency} runs at once")
    lines.extend(_constraint_line(c) for c in spec.constraints)
    if spec.on_refusal:
        name = agent_pb2.OnRefusal.Name(spec.on_refusal).removeprefix("ON_REFUSAL_").lower()
        lines.append(f"on refusal {name}")
    for provider, connection in sorted(spec.connections.items()):
        lines.append(f"connection {provider} -> {connection}")
    return lines


def _constraint_line(c: agent_pb2.ToolConstraint) -> str:
    """`constraint send_email: value_allowed email [@acme.test] (hold)`, say."""
    rule = agent_pb2.ConstraintRule.Name(c.rule).removeprefix("CONSTRAINT_RULE_").lower()
    line = f"constraint {c.tool}: {rule}"
    if c.value_kind:
        line += " " + agent_pb2.ValueKind.Name(c.value_kind).removeprefix("VALUE_KIND_").lower()
    if c.allowed:
        line += " " + short(list(c.allowed), 60)
    if c.or_seen_before:
        line += " or seen before"
    if c.workspace_list:
        line += f" or the workspace's list {c.workspace_list}"
    if c.action:
        action = agent_pb2.ConstraintAction.Name(c.action).removeprefix("CONSTRAINT_ACTION_")
        line += f" ({action.lower()})"
    return line


def publish_warning(warning: agent_pb2.PublishWarning) -> str:
    """One warning about a published version, for stderr."""
    return f"warning [{warning.code}]: {warning.message}"


def _seconds(limits: agent_pb2.RunLimits) -> str:
    if not limits.HasField("deadline"):
        return ""
    return f"{limits.deadline.ToTimedelta().total_seconds():g}s"


# --- JSON ------------------------------------------------------------------


def as_dict(message: Message) -> dict[str, Any]:
    """A message as a JSON-ready dict; step payloads are decoded into `payload`."""
    value = json_format.MessageToDict(
        message,
        always_print_fields_with_no_presence=True,
        preserving_proto_field_name=True,
        unquote_int64_if_possible=True,
    )
    _decode_payloads(value)
    return value


def _decode_payloads(value: Any) -> None:
    if isinstance(value, list):
        for item in value:
            _decode_payloads(item)
    elif isinstance(value, dict):
        if isinstance(value.get("payload_json"), str):
            try:
                value["payload"] = json.loads(value.pop("payload_json"))
            except ValueError:
                value["payload"] = None
        for item in value.values():
            _decode_payloads(item)


def to_json(value: Message | dict[str, Any] | list[Any], indent: int | None = None) -> str:
    """JSON text for a message, or for a dict/list that may contain messages."""
    return json.dumps(_jsonable(value), ensure_ascii=False, indent=indent)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Message):
        return as_dict(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value
