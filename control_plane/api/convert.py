"""Database rows to proto messages, in one place."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from agentrun.v1 import agent_pb2, approval_pb2, run_pb2
from control_plane.api import constraints, model_parameters
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
    since = value - (_EPOCH if value.tzinfo is not None else _EPOCH_NAIVE)
    # A timedelta keeps days signed and seconds and microseconds non-negative: the
    # normalised form of a Timestamp (nanos in [0, 1e9)) before 1970 too.
    return Timestamp(seconds=since.days * 86400 + since.seconds, nanos=since.microseconds * 1000)


def duration(seconds: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def active_seconds(run: Run) -> float:
    """Active time used: the run's ended holds plus the current hold so far (held_seconds,
    computed on the database clock by the query that read the run)."""
    return run.active_seconds + run.held_seconds


def run_limits(row: Run) -> agent_pb2.RunLimits:
    """The limits copied onto a run at admission."""
    return agent_pb2.RunLimits(
        max_steps=row.max_steps,
        deadline=duration(row.deadline_seconds),
        max_tokens=row.max_tokens,
        max_tool_calls=row.max_tool_calls,
        model_retry_budget=row.model_retry_budget,
        max_age=duration(row.max_age_seconds) if row.max_age_seconds else None,
        repeat_limit=row.repeat_limit,
        context_tokens=row.context_tokens,
    )


def run(row: Run) -> run_pb2.Run:
    """A run as the public Run message."""
    msg = run_pb2.Run(
        workspace_id=row.workspace_id,
        run_id=str(row.run_id),
        agent_id=row.agent_id,
        agent_version=row.agent_version,
        status=STATUS_TO_PROTO[row.status],
        wait_reason=row.wait_reason or "",
        lease_owner=row.lease_owner or "",
        lease_epoch=row.lease_epoch,
        attempt=row.attempt,
        limits=run_limits(row),
        counters=run_pb2.RunCounters(
            steps=row.step_count,
            model_calls=row.model_calls,
            tool_calls=row.tool_calls,
            tokens=row.tokens_used,
            input_tokens=row.input_tokens,
            output_tokens=row.output_tokens,
            cached_tokens=row.cached_tokens,
            reasoning_tokens=row.reasoning_tokens,
            cost_micros=row.cost_micros,
        ),  # fmt: skip
        input=row.input,
        output=row.output or "",
        error=row.error or "",
        active_duration=duration(active_seconds(row)),
        parent_run_id=str(row.parent_run_id) if row.parent_run_id else "",
        parent_seq=row.parent_seq or 0,
        forked_from_run_id=str(row.forked_from_run_id) if row.forked_from_run_id else "",
        forked_from_seq=row.forked_from_seq or 0,
        credits_reserved_micros=row.credits_reserved_micros,
        credit_chunks=row.credit_chunks,
        release=row.release or "",
        priority=row.priority,
        # None leaves a field unset.
        wake_time=timestamp(row.wake_at),
        expire_time=timestamp(row.expires_at),
        create_time=timestamp(row.created_at),
        update_time=timestamp(row.updated_at),
        finish_time=timestamp(row.finished_at),
    )
    return msg


# A run parked on one of these waits in a queue, even before its wake time.
QUEUED_WAITS = {
    "rate": run_pb2.QUEUE_WAIT_CAUSE_RATE_LIMIT,
    "model": run_pb2.QUEUE_WAIT_CAUSE_MODEL_UNAVAILABLE,
}


def queue_position(pos: Any, wait_reason: str | None) -> run_pb2.QueuePosition | None:
    """A store QueuePosition as the public message; None for a wait that is no queue (a sleep)."""
    if pos.due:
        cause = (
            run_pb2.QUEUE_WAIT_CAUSE_WORKSPACE_CAP if pos.workspace_full
            else run_pb2.QUEUE_WAIT_CAUSE_AGENT_CAP if pos.agent_full
            else run_pb2.QUEUE_WAIT_CAUSE_TURN
        )  # fmt: skip
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
    msg = run_pb2.Step(
        run_id=str(row.run_id),
        seq=row.seq,
        kind=KIND_TO_PROTO[row.kind],
        epoch=row.epoch,
        ref_seq=row.ref_seq or 0,
        payload_json=row.payload,
        create_time=timestamp(row.created_at),
    )
    return msg


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
