"""RunService.SignalRun: parse the request, send the signal (control_plane/runs/signals.py), convert."""

from __future__ import annotations

from collections.abc import Callable

from agentrun.v1 import run_pb2
from control_plane.auth import context as auth_context
from control_plane.ground import convert, validate
from control_plane.runs import signals
from control_plane.store import runs as run_store
from control_plane.store.db import Pool


def outgoing(request: run_pb2.SignalRunRequest) -> signals.Outgoing:
    """The checked request (INVALID_ARGUMENT names the field; nothing is written)."""
    ws = auth_context.workspace(request.workspace_id)
    run_id = validate.run_id("run_id", request.run_id)
    name = signals.check_name("signal_name", request.signal_name)
    event_id = validate.text(
        "event_id", request.event_id, max_bytes=signals.MAX_EVENT_ID_BYTES, required=True
    )
    payload = validate.json_value(
        "payload_json", request.payload_json or "null", max_bytes=signals.MAX_PAYLOAD_BYTES
    )
    return signals.Outgoing(ws, run_id, name, event_id, payload, auth_context.current().label)


def to_proto(sig: signals.Signal) -> run_pb2.Signal:
    msg = run_pb2.Signal(
        run_id=str(sig.run_id),
        event_id=sig.event_id,
        signal_name=sig.name,
        payload_json=sig.payload,
        sent_by=sig.sent_by,
        consumed_seq=sig.consumed_seq or 0,
        result_seq=sig.result_seq or 0,
    )
    if (created := convert.timestamp(sig.created_at)) is not None:
        msg.create_time.CopyFrom(created)
    if (consumed := convert.timestamp(sig.consumed_at)) is not None:
        msg.consume_time.CopyFrom(consumed)
    return msg


async def signal_run(
    pool: Pool, request: run_pb2.SignalRunRequest, on_runnable: Callable[[], None]
) -> run_pb2.SignalRunResponse:
    wanted = outgoing(request)
    sent = await signals.send(pool, wanted, on_runnable)
    row = await run_store.get_run(pool, wanted.workspace_id, wanted.run_id)
    answer = run_pb2.SignalRunResponse(signal=to_proto(sent.signal), created=sent.created)
    if row is not None:
        answer.run.CopyFrom(convert.run(row))
    return answer
