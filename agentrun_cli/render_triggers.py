"""Triggers, their events and schedule overlap policies (proto messages) as readable lines; pure."""

from __future__ import annotations

from agentrun.v1 import agent_pb2
from agentrun.v1 import trigger_pb2 as pb
from agentrun_cli import render

# The overlap policies by their short names (`skip`, `buffer_one`): shown, and taken by flags.
POLICIES = {
    pb.ScheduleOverlapPolicy.Name(v).removeprefix("SCHEDULE_OVERLAP_POLICY_").lower(): v
    for v in pb.ScheduleOverlapPolicy.values()
    if v
}


def policy_name(value: int) -> str:
    return {v: k for k, v in POLICIES.items()}.get(value, "allow_all")


def source_line(t: pb.Trigger) -> str:
    kind = t.WhichOneof("source")
    if kind == "webhook":
        return f"webhook ({pb.SignatureScheme.Name(t.webhook.scheme).removeprefix('SIGNATURE_SCHEME_').lower()})"
    if kind == "schedule":
        s = t.schedule
        when = (
            f"cron '{s.cron}' {s.time_zone or 'UTC'}"
            if s.cron
            else (f"every {s.interval.ToTimedelta().total_seconds():g}s")
        )
        jitter = s.jitter.ToTimedelta().total_seconds()
        return f"schedule {when}" + (f", jitter {jitter:g}s" if jitter else "")
    if kind == "mail":
        return f"mail {t.mail.address or ''} (max chain depth {t.mail.max_chain_depth})".replace(
            "  ", " "
        )
    push = t.mail_push
    text = f"mail push from {push.history_url} (at history id {push.last_history_id})"
    if push.connection_id:
        text += f" on connection {push.connection_id}"
    if push.fetch_error:
        text += f"; parked: {push.fetch_error}"
    return text


def key_line(ck: agent_pb2.ConcurrencyKey) -> str:
    """A trigger's concurrency_key: its path, limit and rate."""
    rate = f", {ck.rate.runs} per {ck.rate.per_seconds}s" if ck.HasField("rate") else ""
    return f"key       {ck.key}: {ck.limit} at once{rate} (of the runs it starts)"


def trigger_lines(t: pb.Trigger) -> list[str]:
    lines = [
        f"trigger   {t.trigger_id} -> agent {t.agent_id} ({'enabled' if t.enabled else 'disabled'})",
        f"source    {source_line(t)}",
        *(
            [f"publishes event {t.publish_event} (instead of starting runs)"]
            * bool(t.publish_event)
        ),
        *([key_line(t.concurrency_key)] * t.HasField("concurrency_key")),
    ]
    if t.url:
        lines.append(f"url       POST {t.url}")
    if t.note:
        lines.append(f"note      {t.note}")
    if t.priority:
        lines.append(f"priority  {t.priority} (of the runs it starts)")
    if t.webhook.HasField("debounce"):
        deb = t.webhook.debounce
        lines.append(f"flow      debounce on {deb.key}, quiet {deb.quiet_seconds}s")
    if t.webhook.HasField("batch"):
        lines.append(
            f"flow      batch of {t.webhook.batch.max_events} or {t.webhook.batch.max_seconds}s"
        )
    if t.HasField("schedule"):
        lines.append(
            f"next      {render.timestamp(t.schedule.next_fire_time)} "
            f"(slot {render.timestamp(t.schedule.next_slot_time)})"
        )
        lines.append(f"overlap   {policy_name(t.schedule.overlap_policy)}")
        if t.schedule.HasField("buffered_slot_time"):
            lines.append(f"buffered  slot {render.timestamp(t.schedule.buffered_slot_time)}")
    for rule in t.filters:
        operand = rule.value or ",".join(rule.values)
        lines.append(
            f"filter    {rule.field} {pb.FilterOp.Name(rule.op).removeprefix('FILTER_OP_').lower()} {operand}".rstrip()
        )
    for s in t.secrets:
        until = (
            f", retired at {render.timestamp(s.expire_time)}" if s.HasField("expire_time") else ""
        )
        lines.append(f"secret    #{s.secret_id} since {render.timestamp(s.create_time)}{until}")
    return lines


def event_line(e: pb.TriggerEvent) -> str:
    status = pb.TriggerEventStatus.Name(e.status).removeprefix("TRIGGER_EVENT_STATUS_").lower()
    outcome = f"run {e.run_id}" if e.run_id else e.reason
    return f"{render.timestamp(e.receive_time)}  {status:<8}  {e.dedupe_key}  {outcome}"
