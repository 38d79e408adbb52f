"""A trigger's event (its store row) as the TriggerEvent message: what ListTriggerEvents lists
and TriggerScheduleNow answers with (api/triggers.py, api/schedules.py)."""

from __future__ import annotations

from typing import Any

from agentrun.v1 import trigger_pb2 as pb
from control_plane.ground import convert

EVENT_STATUS = {
    "accepted": pb.TRIGGER_EVENT_STATUS_ACCEPTED,
    "filtered": pb.TRIGGER_EVENT_STATUS_FILTERED,
    "pending": pb.TRIGGER_EVENT_STATUS_PENDING,
}


def event_message(row: Any) -> pb.TriggerEvent:
    msg = pb.TriggerEvent(
        event_id=str(row["event_id"]),
        trigger_id=row["trigger_id"],
        dedupe_key=row["dedupe_key"],
        status=EVENT_STATUS[row["status"]],
        reason=row["reason"] or "",
        run_id=str(row["run_id"] or ""),
        chain_depth=row["chain_depth"],
        payload_json=row["payload"],
    )
    if row["scheduled_for"] is not None:
        msg.scheduled_time.CopyFrom(convert.timestamp(row["scheduled_for"]))
    msg.receive_time.CopyFrom(convert.timestamp(row["received_at"]))
    return msg
