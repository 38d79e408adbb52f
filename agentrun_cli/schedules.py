"""`agentrun triggers pause|unpause|update|backfill|trigger-now|delete`.

agentrun triggers pause digest --note "quarter close: no digests"
agentrun triggers unpause digest --note "back"        # the slots it missed are not fired
agentrun triggers update digest --every 3600 --overlap skip --catchup 1800
agentrun triggers backfill digest --start 2026-01-05T00:00:00Z --end 2026-01-06T00:00:00Z
agentrun triggers trigger-now digest --request-id deploy-42
agentrun triggers delete digest
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from agentrun.v1 import trigger_pb2 as pb
from agentrun.v1 import trigger_pb2_grpc
from agentrun_cli import argtypes, credentials, durations, render
from agentrun_cli.render_triggers import POLICIES, trigger_lines

TIMEOUT = 60.0


def _seconds(value: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(round(value * 1e9))
    return d


def _when(text: str) -> Timestamp:
    """An ISO 8601 time (UTC when it names no zone)."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from None
    ts = Timestamp()
    ts.FromDatetime(moment if moment.tzinfo else moment.replace(tzinfo=UTC))
    return ts


def _call(args: argparse.Namespace, method: str, req: Any) -> Any:
    channel = credentials.channel(args.address, credentials.api_key())
    try:
        stub = trigger_pb2_grpc.TriggerServiceStub(channel)
        return getattr(stub, method)(req, timeout=TIMEOUT)
    finally:
        channel.close()


def _print(args: argparse.Namespace, value: Any, lines: list[str]) -> None:
    print(render.to_json(value, indent=2) if args.json else "\n".join(lines))


def pause(args: argparse.Namespace) -> int:
    req = pb.SetTriggerEnabledRequest(
        workspace_id=args.workspace,
        trigger_id=args.trigger_id,
        enabled=args.enabled,
        note=args.note,
    )
    t = _call(args, "SetTriggerEnabled", req).trigger
    _print(args, t, trigger_lines(t))
    return 0


def _merged(current: pb.ScheduleSource, args: argparse.Namespace) -> pb.ScheduleSource:
    """The schedule's spec with the flags given applied (UpdateSchedule replaces it whole)."""
    spec = pb.ScheduleSource()
    spec.CopyFrom(current)
    for output_only in ("next_slot_time", "next_fire_time", "buffered_slot_time"):
        spec.ClearField(output_only)  # type: ignore[arg-type]
    if args.cron:
        spec.cron = args.cron
        spec.ClearField("interval")
    if args.every:
        spec.interval.CopyFrom(_seconds(args.every))
        spec.cron, spec.time_zone = "", ""
    if args.time_zone is not None:
        spec.time_zone = args.time_zone
    if args.jitter is not None:
        spec.jitter.CopyFrom(_seconds(args.jitter))
    if args.input is not None:
        spec.input = args.input
    if args.overlap:
        spec.overlap_policy = POLICIES[args.overlap]  # type: ignore[assignment]
    if args.catchup is not None:
        spec.catchup_window.CopyFrom(_seconds(args.catchup))
    return spec


def update(args: argparse.Namespace) -> int:
    get = pb.GetTriggerRequest(workspace_id=args.workspace, trigger_id=args.trigger_id)
    current = _call(args, "GetTrigger", get).trigger
    req = pb.UpdateScheduleRequest(
        workspace_id=args.workspace,
        trigger_id=args.trigger_id,
        schedule=_merged(current.schedule, args),
    )
    if args.priority is not None:
        req.priority = args.priority
    t = _call(args, "UpdateSchedule", req).trigger
    _print(args, t, trigger_lines(t))
    return 0


def backfill(args: argparse.Namespace) -> int:
    req = pb.BackfillScheduleRequest(
        workspace_id=args.workspace,
        trigger_id=args.trigger_id,
        start_time=args.start,
        end_time=args.end,
        overlap_policy=POLICIES.get(args.overlap or "", 0),  # type: ignore[arg-type]
    )
    r = _call(args, "BackfillSchedule", req)
    _print(
        args,
        r,
        [
            f"{r.slots} slots: {r.started} started, {r.already_fired} already fired, "
            f"{r.skipped} skipped, {r.buffered} buffered"
        ],
    )
    return 0


def trigger_now(args: argparse.Namespace) -> int:
    req = pb.TriggerScheduleNowRequest(
        workspace_id=args.workspace,
        trigger_id=args.trigger_id,
        request_id=args.request_id,
        overlap_policy=POLICIES.get(args.overlap or "", 0),  # type: ignore[arg-type]
    )
    r = _call(args, "TriggerScheduleNow", req)
    if r.buffered:
        line = "buffered: it starts when the schedule's run going now ends"
    elif r.event.run_id:
        line = f"{'started' if r.created else 'already started'}: run {r.event.run_id}"
    else:
        line = f"no run: {r.event.reason}"
    _print(args, r, [line])
    return 0


def delete(args: argparse.Namespace) -> int:
    req = pb.DeleteTriggerRequest(workspace_id=args.workspace, trigger_id=args.trigger_id)
    _call(args, "DeleteTrigger", req)
    _print(args, {"deleted": args.trigger_id}, [f"deleted trigger {args.trigger_id}"])
    return 0


def add_schedule_options(p: argparse.ArgumentParser) -> None:
    """--overlap and --catchup (create and update)."""
    p.add_argument("--overlap", choices=POLICIES, help="while a run goes on (default allow_all)")
    p.add_argument("--catchup", type=durations.arg, metavar="DURATION", help="catch-up window")


def _update_parser(actions: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = actions.add_parser("update", help="change a schedule in place", parents=[common])
    p.add_argument("trigger_id", metavar="ID")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--cron", metavar="EXPR")
    when.add_argument("--every", type=durations.arg, metavar="DURATION")
    p.add_argument("--time-zone", metavar="TZ")
    p.add_argument("--jitter", type=durations.arg, metavar="DURATION")
    p.add_argument("--input", metavar="TEXT")
    p.add_argument(
        "--priority", type=argtypes.int32, metavar="N", help="of the runs it starts, -100..100"
    )
    add_schedule_options(p)
    p.set_defaults(handler=update)


def add_commands(actions: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    for name, enabled in (("pause", False), ("unpause", True)):
        p = actions.add_parser(name, help=f"{name} a trigger, with a note", parents=[common])
        p.add_argument("trigger_id", metavar="ID")
        p.add_argument("--note", default="", metavar="TEXT", help="why")
        p.set_defaults(handler=pause, enabled=enabled)
    _update_parser(actions, common)
    p = actions.add_parser("backfill", help="fire a schedule's slots in a range", parents=[common])
    p.add_argument("trigger_id", metavar="ID")
    p.add_argument("--start", required=True, type=_when, metavar="ISO", help="first slot at/after")
    p.add_argument("--end", required=True, type=_when, metavar="ISO", help="slots before")
    p.add_argument("--overlap", choices=POLICIES, help="default: the schedule's")
    p.set_defaults(handler=backfill)
    p = actions.add_parser("trigger-now", help="fire a schedule once now", parents=[common])
    p.add_argument("trigger_id", metavar="ID")
    p.add_argument("--request-id", default="", metavar="K", help="dedupe key for retries")
    p.add_argument("--overlap", choices=POLICIES, help="default: the schedule's")
    p.set_defaults(handler=trigger_now)
    p = actions.add_parser("delete", help="delete a trigger and its events", parents=[common])
    p.add_argument("trigger_id", metavar="ID")
    p.set_defaults(handler=delete)
