"""TriggerService's schedule RPCs (update, delete, backfill, trigger now) and the schedule
spec's parsing and output: parse, call control_plane/triggers/schedule_ops.py, convert."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import grpc

from agentrun.v1 import trigger_pb2 as pb
from control_plane.api.trigger_events import event_message
from control_plane.auth import audit
from control_plane.auth import context as auth_context
from control_plane.ground import convert, validate
from control_plane.ground.config import RunDefaults
from control_plane.ground.errors import InvalidArgument, NotFound
from control_plane.store import schedules as store
from control_plane.store.admission import MAX_INPUT_BYTES
from control_plane.store.db import Pool, transaction
from control_plane.triggers import overlap, schedule, schedule_ops

POLICY_NAMES = {
    value: pb.ScheduleOverlapPolicy.Name(value).removeprefix("SCHEDULE_OVERLAP_POLICY_").lower()
    for value in pb.ScheduleOverlapPolicy.values()
    if value
}
POLICY_VALUES = {name: value for value, name in POLICY_NAMES.items()}
MAX_NOTE_BYTES = 1024


def _seconds(duration: Any) -> float:
    return float(duration.ToTimedelta().total_seconds())


def policy(field: str, value: int) -> str | None:
    """The policy a request names; None for unspecified."""
    if not value:
        return None
    if value not in POLICY_NAMES:
        raise InvalidArgument(field, f"must be one of {', '.join(POLICY_VALUES).upper()}")
    return POLICY_NAMES[value]


def parse_schedule(src: pb.ScheduleSource, now: datetime) -> tuple[schedule.Schedule, str]:
    """A validated schedule and its run input, from a CreateTrigger or UpdateSchedule spec."""
    overlap_policy = policy("schedule.overlap_policy", src.overlap_policy)
    catchup = _seconds(src.catchup_window) if src.HasField("catchup_window") else None
    try:
        sched = schedule.build(
            src.cron,
            src.time_zone,
            _seconds(src.interval),
            _seconds(src.jitter),
            now,
            overlap=overlap_policy or schedule.DEFAULT_OVERLAP,
            catchup_seconds=catchup,
        )
    except schedule.ScheduleError as exc:
        raise InvalidArgument(exc.field, str(exc)) from None
    text = validate.text("schedule.input", src.input, max_bytes=MAX_INPUT_BYTES) or "Scheduled run"
    return sched, text


def schedule_source(msg: pb.ScheduleSource, row: Any, config: dict[str, Any]) -> None:
    """Fill a ScheduleSource from a schedule trigger's row."""
    sched = schedule.Schedule.from_json(config)
    msg.cron = sched.cron or ""
    msg.time_zone = sched.time_zone if sched.cron else ""
    if sched.interval_seconds:
        msg.interval.CopyFrom(convert.duration(sched.interval_seconds))
    msg.jitter.CopyFrom(convert.duration(sched.jitter_seconds))
    msg.input = config.get("input", "")
    msg.next_slot_time.CopyFrom(convert.timestamp(row["next_slot_at"]))
    msg.next_fire_time.CopyFrom(convert.timestamp(row["next_fire_at"]))
    msg.overlap_policy = POLICY_VALUES[sched.overlap]  # type: ignore[assignment]
    if sched.catchup_seconds is not None:
        msg.catchup_window.CopyFrom(convert.duration(sched.catchup_seconds))
    if row["buffered_slot_at"] is not None:
        msg.buffered_slot_time.CopyFrom(convert.timestamp(row["buffered_slot_at"]))


def _time(field: str, value: Any, present: bool) -> datetime:
    if not present:
        raise InvalidArgument(field, "is required")
    return value.ToDatetime(tzinfo=UTC)  # type: ignore[no-any-return]


class ScheduleRpcs:
    """The schedule RPCs of TriggerServicer (which provides `_message`)."""

    _pool: Pool
    _defaults: RunDefaults
    _on_runnable: Callable[[], None]
    _on_cancel: Callable[[str, uuid.UUID], None] | None

    async def _message(self, row: Any) -> pb.Trigger:
        raise NotImplementedError

    def _committed(self, firing: overlap.Firing) -> None:
        firing.committed(self._on_runnable, self._on_cancel)

    async def UpdateSchedule(
        self, request: pb.UpdateScheduleRequest, context: grpc.aio.ServicerContext
    ) -> pb.UpdateScheduleResponse:
        ws = auth_context.workspace(request.workspace_id)
        trigger_id = validate.slug("trigger_id", request.trigger_id)
        sched, text = parse_schedule(request.schedule, datetime.now(UTC))
        priority = (
            validate.priority("priority", request.priority)
            if request.HasField("priority")
            else None
        )
        async with transaction(self._pool) as conn:
            row = await schedule_ops.update(conn, ws, trigger_id, sched, text, priority=priority)
            await audit.record(conn, "trigger.updated", "trigger", trigger_id, sched.to_json())
        return pb.UpdateScheduleResponse(trigger=await self._message(row))

    async def DeleteTrigger(
        self, request: pb.DeleteTriggerRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteTriggerResponse:
        ws = auth_context.workspace(request.workspace_id)
        trigger_id = validate.slug("trigger_id", request.trigger_id)
        async with transaction(self._pool) as conn:
            row = await store.delete(conn, ws, trigger_id)
            if row is not None:
                detail = {"kind": row["kind"]}
                await audit.record(conn, "trigger.deleted", "trigger", trigger_id, detail)
        if row is None:
            raise NotFound(f"trigger {trigger_id!r} not found")
        return pb.DeleteTriggerResponse()

    async def BackfillSchedule(
        self, request: pb.BackfillScheduleRequest, context: grpc.aio.ServicerContext
    ) -> pb.BackfillScheduleResponse:
        ws = auth_context.workspace(request.workspace_id)
        trigger_id = validate.slug("trigger_id", request.trigger_id)
        start = _time("start_time", request.start_time, request.HasField("start_time"))
        end = _time("end_time", request.end_time, request.HasField("end_time"))
        chosen = policy("overlap_policy", request.overlap_policy)
        firing = overlap.Firing(self._defaults)
        async with transaction(self._pool) as conn:
            done = await schedule_ops.backfill(conn, ws, trigger_id, start, end, chosen, firing)
            await audit.record(
                conn,
                "trigger.backfilled",
                "trigger",
                trigger_id,
                {
                    "start": start.isoformat(),
                    "end": end.isoformat(),
                    "slots": done.slots,
                    "started": firing.started,
                    "overlap_policy": chosen,
                },
            )
        self._committed(firing)
        c = done.counts
        return pb.BackfillScheduleResponse(
            slots=done.slots,
            started=c[overlap.Fired.STARTED],
            already_fired=c[overlap.Fired.ALREADY],
            skipped=c[overlap.Fired.SKIPPED],
            buffered=c[overlap.Fired.BUFFERED],
        )

    async def TriggerScheduleNow(
        self, request: pb.TriggerScheduleNowRequest, context: grpc.aio.ServicerContext
    ) -> pb.TriggerScheduleNowResponse:
        ws = auth_context.workspace(request.workspace_id)
        trigger_id = validate.slug("trigger_id", request.trigger_id)
        request_id = validate.text("request_id", request.request_id, max_bytes=200) or None
        chosen = policy("overlap_policy", request.overlap_policy)
        firing = overlap.Firing(self._defaults)
        async with transaction(self._pool) as conn:
            done = await schedule_ops.trigger_now(conn, ws, trigger_id, request_id, chosen, firing)
            await audit.record(
                conn,
                "trigger.fired_now",
                "trigger",
                trigger_id,
                {
                    "outcome": str(done.fired),
                    "request_id": request_id,
                },
            )
        self._committed(firing)
        resp = pb.TriggerScheduleNowResponse(
            created=done.fired in (overlap.Fired.STARTED, overlap.Fired.SKIPPED),
            buffered=done.fired is overlap.Fired.BUFFERED,
        )
        if done.event is not None:
            resp.event.CopyFrom(event_message(done.event))
        return resp
