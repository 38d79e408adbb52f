"""`agentrun events publish NAME --id ID --body JSON`: publish an event to the workspace.

agentrun events publish invoice.paid --id inv-42-paid --body '{"customer": "c-17"}'

Every run waiting in a wait_for_event call whose name and match the event satisfies gets it
as that call's result, and every unfinished run whose agent declares a matching cancel_on
is cancelled (RunService.PublishEvent). The same id again wakes nothing more.
"""

from __future__ import annotations

import argparse

from agentrun.v1 import run_pb2
from agentrun_cli import output
from agentrun_cli.client import Client


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    events = sub.add_parser(
        "events", help="publish events that runs wait for (wait_for_event, cancel_on)"
    ).add_subparsers(dest="events_command", required=True, metavar="ACTION")
    p = events.add_parser(
        "publish", help="publish a named event with a JSON object body", parents=[common]
    )
    p.add_argument("name", metavar="NAME", help="the event's name, e.g. invoice.paid")
    p.add_argument(
        "--id", required=True, dest="event_id", metavar="ID", help="idempotency: your event's id"
    )
    p.add_argument("--body", required=True, metavar="JSON", help="a JSON object")
    p.set_defaults(handler=events_publish)


def events_publish(args: argparse.Namespace) -> int:
    with Client(args.address, args.workspace) as client:
        req = run_pb2.PublishEventRequest(
            workspace_id=client.workspace,
            event_name=args.name,
            event_id=args.event_id,
            body_json=args.body,
        )
        resp = client.runs.PublishEvent(req, timeout=client.timeout)
    ev = resp.event
    line = (
        f"event {ev.event_name} {ev.event_id}: woke {ev.woke} run(s), cancelled {ev.cancelled}"
        if resp.created
        else f"event {ev.event_name} {ev.event_id}: already published (nothing woken again)"
    )
    output.emit(args, resp, [line])
    return 0
