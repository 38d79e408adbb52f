"""Database rows to proto messages, in one place."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from agentrun.v1 import agent_pb2, approval_pb2, run_pb2
from control_plane.ground import constraints, model_parameters
from control_plane.store.runs import Run
from control_plane.store.steps import Step

STATUS_TO_PROTO = {
    "queued": run_pb2.RUN_STATUS_QUEUED,
    "running": run_pb2.RUN_STATUS_RUNNING,
    "waiting": run_pb2.RUN_STATUS_WAITING,
    "completed": run_pb2.RUN_STATUS_COMPLETED,
    "failed": run_pb2.RUN_STATUS_FAILED,
    "cancelled": run_pb2.RUN_STATUS_CANCELLED,
}
STATUS_FROM_PROTO = {v: k for k, v in STATUS_TO_PROTO.items()}

KIND_TO_PROTO = {
    "input": run_pb2.STEP_KIND_INPUT,
    "model_decision": run_pb2.STEP_KIND_MODEL_DECISION,
    "tool_started": run_pb2.STEP_KIND_TOOL_STARTED,
    "tool_result": run_pb2.STEP_KIND_TOOL_RESULT,
    "park": run_pb2.STEP_KIND_PARK,
    "finish": run_pb2.STEP_KIND_FINISH,
    "approval_requested": run_pb2.STEP_KIND_APPROVAL_REQUESTED,
    "approval_decided": run_pb2.STEP_KIND_APPROVAL_DECIDED,
    "summary": run_pb2.STEP_KIND_SUMMARY,
}
KIND_FROM_PROTO = {v: k for k, v in KIND_TO_PROTO.items()}
# Written by the control plane at a fork's admission only: no executor commits one.
KIND_TO_PROTO["forked"] = run_pb2.STEP_KIND_FORKED


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_NAIVE = datetime(1970, 1, 1)  # a naive datetime is UTC, as Timestamp.FromDatetime's


def timestamp(value: datetime | None) -> Timestamp | None:
    """What Timestamp.FromDatetime gives, computed directly (it goes through a time tuple and
    calendar.timegm, 2-3x the cost, and every run and step sent carries timestamps)."""
    if value is None or value in (datetime.min, datetime.max):
        return None
    ts = Timestamp()
    _set_timestamp(ts, value)
    return ts


def _set_timestamp(field: Timestamp, value: datetime | None) -> None:
    """timestamp(value) written into a message's own field (None leaves it unset): no
    message built and then copied in, as a constructor argument is."""
    if value is None:
        return
    if value.tzinfo is None:
        # asyncpg reads infinity as the naive datetime.max (and -infinity as .min).
        if value == datetime.min or value == datetime.max:
            return
        since = value - _EPOCH_NAIVE
    else:
        since = value - _EPOCH
    # A timedelta keeps days signed and seconds and microseconds non-negative: the
    # normalised form of a Timestamp (nanos in [0, 1e9)) before 1970 too.
    field.seconds = since.days * 86400 + since.seconds
    field.nanos = since.microseconds * 1000


def duration(seconds: float) -> Duration:
    d = Duration()
    set_duration(d, seconds)
    return d


def set_duration(field: Duration, seconds: float) -> None:
    """duration(seconds) written into a message's own field, as _set_timestamp. What
    Duration.FromNanoseconds does, without its Python-level normalising for the usual
    case (no time is negative): a third of the cost."""
    nanos = int(seconds * 1e9)
    if nanos >= 0:
        field.seconds, field.nanos = divmod(nanos, 1_000_000_000)
    else:
        field.FromNanoseconds(nanos)


def active_seconds(run: Run) -> float:
    """Active time used: the run's ended holds plus the current hold so far (held_seconds,
    computed on the database clock by the query that read the run)."""
    return run.active_seconds + run.held_seconds


def _set_limits(limits: agent_pb2.RunLimits, row: Run) -> None:
    """The limits copied onto a run at admission."""
    limits.max_steps = row.max_steps
    set_duration(limits.deadline, row.deadline_seconds)
    limits.max_tokens = row.max_tokens
    limits.max_tool_calls = row.max_tool_calls
    limits.model_retry_budget = row.model_retry_budget
    if row.max_age_seconds:
        set_duration(limits.max_age, row.max_age_seconds)
    limits.repeat_limit = row.repeat_limit
    limits.context_tokens = row.context_tokens


def run(row: Run) -> run_pb2.Run:
    """A run as the public Run message."""
    msg = run_pb2.Run()
    set_run(msg, row)
    return msg


def set_run(msg: run_pb2.Run, row: Run) -> None:
    """run(row) written into an empty Run field (an Assignment's): its sub-messages are
    filled where they are, not built and then copied in as constructor arguments are
    (a third of the cost; every claimed run is converted). A field whose value is its
    default (0, "", None) is left unset, which is the same message (no field here tracks
    presence): a fresh run has a dozen, and testing a field costs less than setting it
    (9 -> 6 us a fresh run, with set_duration's shortcut)."""
    msg.workspace_id = row.workspace_id
    msg.run_id = str(row.run_id)
    msg.agent_id = row.agent_id
    msg.agent_version = row.agent_version
    msg.status = STATUS_TO_PROTO[row.status]
    if row.wait_reason:
        msg.wait_reason = row.wait_reason
    if row.lease_owner:
        msg.lease_owner = row.lease_owner
    msg.lease_epoch = row.lease_epoch
    if row.attempt:
        msg.attempt = row.attempt
    _set_limits(msg.limits, row)
    _set_counters(msg.counters, row)
    msg.input = row.input
    if row.output:
        msg.output = row.output
    if row.error:
        msg.error = row.error
    set_duration(msg.active_duration, active_seconds(row))
    _set_lineage(msg, row)
    if row.release:
        msg.release = row.release
    if row.priority:
        msg.priority = row.priority
    if row.finished_at is not None:
        msg.outcome = outcome(row.status, row.refused_calls, row.tool_calls)
    _set_labels(msg, row)
    # None leaves a field unset.
    _set_timestamp(msg.wake_time, row.wake_at)
    _set_timestamp(msg.expire_time, row.expires_at)
    _set_timestamp(msg.create_time, row.created_at)
    _set_timestamp(msg.update_time, row.updated_at)
    _set_timestamp(msg.finish_time, row.finished_at)


def _set_labels(msg: run_pb2.Run, row: Run) -> None:
    """set_run's tags, metadata and pause (0045_orchestration.sql)."""
    if row.tags:
        msg.tags.extend(row.tags)
    msg.metadata_json = row.metadata
    if row.paused:
        msg.paused = True


def _set_counters(counters: run_pb2.RunCounters, row: Run) -> None:
    """set_run's counters (those at 0 left unset)."""
    counters.steps = row.step_count
    if row.model_calls:
        counters.model_calls = row.model_calls
    if row.tool_calls:
        counters.tool_calls = row.tool_calls
    if row.tokens_used:
        counters.tokens = row.tokens_used
    if row.input_tokens:
        counters.input_tokens = row.input_tokens
    if row.output_tokens:
        counters.output_tokens = row.output_tokens
    if row.cached_tokens:
        counters.cached_tokens = row.cached_tokens
    if row.reasoning_tokens:
        counters.reasoning_tokens = row.reasoning_tokens
    if row.cost_micros:
        counters.cost_micros = row.cost_micros
    if row.refused_calls:
        counters.refused_calls = row.refused_calls


def outcome(status: str, refused_calls: int, tool_calls: int) -> run_pb2.RunOutcome.ValueType:
    """A finished run's outcome (issue 48): a completed run whose calls constraints refused
    says so, and one whose every call was refused (none started) is no success at all."""
    if status == "completed":
        if not refused_calls:
            return run_pb2.RUN_OUTCOME_COMPLETED
        if tool_calls:
            return run_pb2.RUN_OUTCOME_COMPLETED_WITH_REFUSALS
        return run_pb2.RUN_OUTCOME_ONLY_REFUSED
    if status == "failed":
        return run_pb2.RUN_OUTCOME_FAILED
    if status == "cancelled":
        return run_pb2.RUN_OUTCOME_CANCELLED
    return run_pb2.RUN_OUTCOME_UNSPECIFIED


def _set_lineage(msg: run_pb2.Run, row: Run) -> None:
    """set_run's parent, fork and credit fields, which most runs do not have."""
    if row.parent_run_id:
        msg.parent_run_id = str(row.parent_run_id)
    if row.parent_seq:
        msg.parent_seq = row.parent_seq
    if row.parent_index is not None:
        msg.parent_index = row.parent_index
    if row.parent_close:
        msg.parent_close = row.parent_close
    if row.concurrency_key is not None:
        msg.concurrency_key = row.concurrency_key
    if row.forked_from_run_id:
        msg.forked_from_run_id = str(row.forked_from_run_id)
    if row.forked_from_seq:
        msg.forked_from_seq = row.forked_from_seq
    if row.credits_reserved_micros:
        msg.credits_reserved_micros = row.credits_reserved_micros
    if row.credit_chunks:
        msg.credit_chunks = row.credit_chunks


# A run parked on one of these waits in a queue, even before its wake time.
QUEUED_WAITS = {
    "rate": run_pb2.QUEUE_WAIT_CAUSE_RATE_LIMIT,
    "model": run_pb2.QUEUE_WAIT_CAUSE_MODEL_UNAVAILABLE,
}


def queue_position(pos: Any, wait_reason: str | None) -> run_pb2.QueuePosition | None:
    """A store QueuePosition as the public message; None for a wait that is no queue (a sleep)."""
    if pos.due:
        cause = (
            run_pb2.QUEUE_WAIT_CAUSE_WORKSPACE_CAP
            if pos.workspace_full
            else run_pb2.QUEUE_WAIT_CAUSE_AGENT_CAP
            if pos.agent_full
            else run_pb2.QUEUE_WAIT_CAUSE_TURN
        )
    elif wait_reason in QUEUED_WAITS:
        cause = QUEUED_WAITS[wait_reason]
    else:
        return None
    return run_pb2.QueuePosition(
        runs_ahead=pos.runs_ahead,
        cause=cause,  # type: ignore[arg-type]
        workspace_running=pos.workspace_running,
        workspace_max_concurrency=pos.workspace_max_concurrency,
        agent_running=pos.agent_running,
        agent_max_concurrency=pos.agent_max_concurrency or 0,
    )


def step(row: Step) -> run_pb2.Step:
    msg = run_pb2.Step()
    set_step(msg, row)
    return msg


def set_step(msg: run_pb2.Step, row: Step) -> None:
    """step(row) written into an empty Step (a repeated field's new element), as set_run."""
    msg.run_id = str(row.run_id)
    msg.seq = row.seq
    msg.kind = KIND_TO_PROTO[row.kind]
    msg.epoch = row.epoch
    msg.ref_seq = row.ref_seq or 0
    msg.payload_json = row.payload
    _set_timestamp(msg.create_time, row.created_at)
    msg.release = row.release or ""


def agent(row: Any) -> agent_pb2.Agent:
    msg = agent_pb2.Agent(
        workspace_id=row["workspace_id"],
        agent_id=row["agent_id"],
        display_name=row["display_name"],
        latest_version=row["latest_version"],
    )
    msg.create_time.CopyFrom(timestamp(row["created_at"]))
    return msg


def spec_to_json(spec: agent_pb2.AgentSpec, limits: dict[str, int]) -> dict[str, Any]:
    """The stored form of a spec, with limits already resolved."""
    return {
        "instructions": spec.instructions,
        "model": spec.model,
        "tools": list(spec.tools),
        "limits": limits,
        "approval": approval_policy_to_json(spec.approval),
        "max_concurrency": spec.max_concurrency,
        "constraints": constraints.to_json(spec.constraints),
        # Only when named: specs without connections keep their stored form.
        **({"connections": dict(spec.connections)} if spec.connections else {}),
        **model_parameters.to_json(spec),
        # Only when set: other specs keep their stored form.
        **({"fast_path": True} if spec.fast_path else {}),
        **(
            {"unknown_outcome": unknown_policy_to_json(spec.unknown_outcome)}
            if spec.HasField("unknown_outcome")
            else {}
        ),
        **(
            {"on_refusal": constraints.ON_REFUSAL[spec.on_refusal]}
            if spec.on_refusal in constraints.ON_REFUSAL
            else {}
        ),
        # Only when declared: other specs keep their stored form.
        **(
            {"cancel_on": [{"event": c.event, "match": c.match} for c in spec.cancel_on]}
            if spec.cancel_on
            else {}
        ),
        **(
            {"concurrency_key": concurrency_key_to_json(spec.concurrency_key)}
            if spec.HasField("concurrency_key")
            else {}
        ),
    }


EXPIRY_ACTIONS = {1: "reject", 2: "escalate", 3: "remind"}


def approval_policy_to_json(pol: approval_pb2.ApprovalPolicy) -> dict[str, Any]:
    return {
        "tools": list(pol.tools),
        "approvers": list(pol.approvers),
        "slack_approvers": list(pol.slack_approvers),
        "expiry_seconds": pol.expiry_seconds,
        "on_expiry": EXPIRY_ACTIONS.get(pol.on_expiry, "reject"),
        "escalate_to": list(pol.escalate_to),
        "max_reminders": pol.max_reminders,
        "high_risk_tools": list(pol.high_risk_tools),
        "four_eyes": pol.four_eyes,
    }


def approval_policy_from_json(data: dict[str, Any]) -> approval_pb2.ApprovalPolicy:
    actions = {v: k for k, v in EXPIRY_ACTIONS.items()}
    return approval_pb2.ApprovalPolicy(
        tools=data.get("tools", []),
        approvers=data.get("approvers", []),
        slack_approvers=data.get("slack_approvers", []),
        expiry_seconds=data.get("expiry_seconds", 0),
        on_expiry=actions.get(data.get("on_expiry", "reject"), 1),
        escalate_to=data.get("escalate_to", []),
        max_reminders=data.get("max_reminders", 0),
        high_risk_tools=data.get("high_risk_tools", []),
        four_eyes=data.get("four_eyes", False),
    )


UNKNOWN_TIMEOUTS = {1: "remind", 2: "escalate", 3: "fail"}


def unknown_policy_to_json(pol: agent_pb2.UnknownOutcomePolicy) -> dict[str, Any]:
    """The stored form control_plane/approvals/unknown_outcome.py reads (issue 43)."""
    return {
        "ask": list(pol.ask),
        "slack": list(pol.slack),
        "slack_channel": pol.slack_channel,
        "every_seconds": pol.every_seconds,
        "on_timeout": UNKNOWN_TIMEOUTS.get(pol.on_timeout, "remind"),
        "escalate_to": list(pol.escalate_to),
        **({"max_reminders": pol.max_reminders} if pol.HasField("max_reminders") else {}),
    }


def unknown_policy_from_json(data: dict[str, Any]) -> agent_pb2.UnknownOutcomePolicy:
    timeouts = {v: k for k, v in UNKNOWN_TIMEOUTS.items()}
    return agent_pb2.UnknownOutcomePolicy(
        ask=data.get("ask", []),
        slack=data.get("slack", []),
        slack_channel=data.get("slack_channel", ""),
        every_seconds=data.get("every_seconds", 0),
        on_timeout=timeouts.get(data.get("on_timeout", "remind"), 1),  # type: ignore[arg-type]
        escalate_to=data.get("escalate_to", []),
        max_reminders=data.get("max_reminders"),
    )


def spec_from_json(data: dict[str, Any]) -> agent_pb2.AgentSpec:
    lim = data.get("limits", {})
    return agent_pb2.AgentSpec(
        instructions=data.get("instructions", ""),
        model=data.get("model", ""),
        tools=data.get("tools", []),
        limits=agent_pb2.RunLimits(
            max_steps=lim.get("max_steps", 0),
            deadline=duration(lim.get("deadline_seconds", 0)),
            max_tokens=lim.get("max_tokens", 0),
            max_tool_calls=lim.get("max_tool_calls", 0),
            model_retry_budget=lim.get("model_retry_budget", 0),
            max_age=duration(lim.get("max_age_seconds", 0)) if lim.get("max_age_seconds") else None,
            repeat_limit=lim.get("repeat_limit", 0),
            context_tokens=lim.get("context_tokens", 0),
        ),
        approval=approval_policy_from_json(data.get("approval") or {}),
        max_concurrency=data.get("max_concurrency", 0),
        constraints=constraints.from_json(data.get("constraints") or []),
        connections=data.get("connections") or {},
        **model_parameters.from_json(data),
        fast_path=bool(data.get("fast_path", False)),
        unknown_outcome=(
            unknown_policy_from_json(data["unknown_outcome"]) if "unknown_outcome" in data else None
        ),
        on_refusal=constraints.ON_REFUSAL_VALUES.get(  # type: ignore[arg-type]
            data.get("on_refusal", ""), 0
        ),
        cancel_on=[
            agent_pb2.CancelOn(event=c.get("event", ""), match=c.get("match", ""))
            for c in data.get("cancel_on") or []
        ],
        concurrency_key=concurrency_key_from_json(data.get("concurrency_key")),
    )


def concurrency_key_to_json(ck: agent_pb2.ConcurrencyKey) -> dict[str, Any]:
    """The stored rule; `path` is what migration 0050's admission trigger reads."""
    out: dict[str, Any] = {"key": ck.key, "path": ck.key.split(".")[1:], "limit": ck.limit}
    if ck.HasField("rate"):
        out["rate"] = {"per_seconds": ck.rate.per_seconds, "runs": ck.rate.runs}
    return out


def concurrency_key_from_json(data: Any) -> agent_pb2.ConcurrencyKey | None:
    if not data:
        return None
    rate = data.get("rate")
    return agent_pb2.ConcurrencyKey(
        key=data.get("key", ""),
        limit=data.get("limit", 0),
        rate=agent_pb2.KeyRate(per_seconds=rate["per_seconds"], runs=rate["runs"])
        if rate
        else None,
    )


def agent_version(row: Any) -> agent_pb2.AgentVersion:
    spec = row["spec"]
    msg = agent_pb2.AgentVersion(
        workspace_id=row["workspace_id"],
        agent_id=row["agent_id"],
        version=row["version"],
        spec=spec_from_json(json.loads(spec) if isinstance(spec, str) else spec),
    )
    msg.create_time.CopyFrom(timestamp(row["created_at"]))
    pins = row.get("tool_versions")  # the registry versions its runs use (issue 18)
    for name, pin in (json.loads(pins) if isinstance(pins, str) else pins or {}).items():
        msg.tool_versions[name] = int(pin["version"])
    return msg
