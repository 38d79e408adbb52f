"""RunService.PublishEvent: parse the request, publish the event (control_plane/runs/events.py),
convert."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from agentrun.v1 import run_pb2
from control_plane.auth import context as auth_context
from control_plane.ground import convert, validate
from control_plane.ground.errors import InvalidArgument
from control_plane.runs import events, signals
from control_plane.store.db import Pool


def outgoing(request: run_pb2.PublishEventRequest) -> events.Outgoing:
    """The checked request (INVALID_ARGUMENT names the field; nothing is written)."""
    ws = auth_context.workspace(request.workspace_id)
    name = signals.check_name("event_name", request.event_name)
    event_id = validate.text(
        "event_id", request.event_id, max_bytes=events.MAX_EVENT_ID_BYTES, required=True
    )
    if not request.body_json:
        raise InvalidArgument("body_json", "is required (a JSON object)")
    body = validate.json_value("body_json", request.body_json, max_bytes=events.MAX_BODY_BYTES)
    if not isinstance(body, dict):
        raise InvalidArgument("body_json", "must be a JSON object")
    return events.Outgoing(ws, name, event_id, body, auth_context.current().label)


def to_proto(ev: events.Event) -> run_pb2.Event:
    msg = run_pb2.Event(
        event_id=ev.event_id,
        event_name=ev.name,
        body_json=ev.body,
        published_by=ev.published_by,
        woke=ev.woke,
        cancelled=ev.cancelled,
    )
    if (published := convert.timestamp(ev.published_at)) is not None:
        msg.publish_time.CopyFrom(published)
    return msg


async def publish_event(
    pool: Pool,
    request: run_pb2.PublishEventRequest,
    on_runnable: Callable[[], None],
    on_cancel: Callable[[str, uuid.UUID], None],
) -> run_pb2.PublishEventResponse:
    published = await events.publish(pool, outgoing(request), on_runnable, on_cancel)
    return run_pb2.PublishEventResponse(event=to_proto(published.event), created=published.created)
