"""`agentrun triggers create|list|show|events|rotate-secret|enable|disable` (schedules.py:
pause|unpause|update|backfill|trigger-now|delete).

    agentrun triggers create stripe-paid --agent billing --webhook stripe --secret whsec_…
    agentrun triggers create digest --agent digest --cron "0 9 * * 1-5" --time-zone Europe/Paris --jitter 300
    agentrun triggers create leads --agent triage --mail leads@acme.test \\
        --filter "from_address not_in ada@example.com,grace@example.com"
    agentrun triggers create orders --agent fulfil --webhook hmac \\
        --concurrency-key input.customer_id --key-limit 2 --key-rate 10/60
    agentrun triggers events stripe-paid
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

from google.protobuf.duration_pb2 import Duration

from agentrun.v1 import agent_pb2, trigger_pb2_grpc
from agentrun.v1 import trigger_pb2 as pb
from agentrun_cli import argtypes, credentials, durations, output, schedules
from agentrun_cli.output import Column
from agentrun_cli.render_triggers import POLICIES, event_line, source_line, trigger_lines

TIMEOUT = 30.0
SCHEMES = {
    "hmac": pb.SIGNATURE_SCHEME_HMAC_SHA256,
    "stripe": pb.SIGNATURE_SCHEME_STRIPE,
    "slack": pb.SIGNATURE_SCHEME_SLACK,
    "github": pb.SIGNATURE_SCHEME_GITHUB,
    "standard-webhooks": pb.SIGNATURE_SCHEME_STANDARD_WEBHOOKS,
}
OPS = {pb.FilterOp.Name(v).removeprefix("FILTER_OP_").lower(): v for v in pb.FilterOp.values() if v}


def key_rate(text: str) -> agent_pb2.KeyRate:
    """`--key-rate RUNS/SECONDS`: slot grants per key per window, e.g. 10/60."""
    runs, sep, seconds = text.partition("/")
    if not sep or not runs.strip().isdigit() or not seconds.strip().isdigit():
        raise argparse.ArgumentTypeError(f"is not RUNS/SECONDS (e.g. 10/60): {text!r}")
    return agent_pb2.KeyRate(runs=int(runs), per_seconds=int(seconds))


def _key_rule(args: argparse.Namespace) -> dict[str, agent_pb2.ConcurrencyKey]:
    """The trigger's concurrency_key, when any of its flags is given (the server checks it:
    a limit without a key is refused, naming concurrency_key.key)."""
    if not (args.concurrency_key or args.key_limit or args.key_rate):
        return {}
    return {
        "concurrency_key": agent_pb2.ConcurrencyKey(
            key=args.concurrency_key, limit=args.key_limit, rate=args.key_rate
        )
    }


def _seconds(value: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(round(value * 1e9))
    return d


def add_priority(p: argparse.ArgumentParser, default: int | None = 0, unset: str = "0") -> None:
    """`--priority N` of the runs a command starts (a run's, a trigger's, a turn's); with
    default None, leaving it out asks for what `unset` says (a fork: the source's)."""
    p.add_argument(
        "--priority",
        type=argtypes.int32,
        default=default,
        metavar="N",
        help=f"-100..100, higher first within the workspace (default {unset})",
    )


def parse_filter(text: str) -> pb.FilterRule:
    """'FIELD OP [VALUE]' — for in/not_in the value is a comma-separated list."""
    parts = text.split(None, 2)
    if len(parts) < 2 or parts[1] not in OPS:
        raise argparse.ArgumentTypeError(
            f"filter {text!r}: expected 'FIELD OP [VALUE]' with OP one of {', '.join(OPS)}"
        )
    field, op, value = parts[0], parts[1], parts[2] if len(parts) > 2 else ""
    if op in ("in", "not_in"):
        values = [v.strip() for v in value.split(",") if v.strip()]
        return pb.FilterRule(field=field, op=OPS[op], values=values)
    return pb.FilterRule(field=field, op=OPS[op], value=value)


def _source(args: argparse.Namespace) -> dict[str, Any]:
    if args.webhook:
        hook = pb.WebhookSource(scheme=SCHEMES[args.webhook], untimed=args.untimed)
        # Flow control; the server says which value is wrong (webhook.debounce.…, …batch.…).
        hook.debounce.key, hook.debounce.quiet_seconds = args.debounce_key, args.debounce_seconds
        hook.batch.max_events, hook.batch.max_seconds = args.batch_size, args.batch_seconds
        if args.tolerance is not None:
            hook.tolerance.CopyFrom(_seconds(args.tolerance))
        return {"webhook": hook}
    if args.cron or args.every:
        sched = pb.ScheduleSource(cron=args.cron or "", time_zone=args.time_zone, input=args.input)
        if args.every:
            sched.interval.CopyFrom(_seconds(args.every))
        sched.jitter.CopyFrom(_seconds(args.jitter))
        sched.overlap_policy = POLICIES.get(args.overlap or "", 0)  # type: ignore[assignment]
        if args.catchup is not None:
            sched.catchup_window.CopyFrom(_seconds(args.catchup))
        return {"schedule": sched}
    if args.mail is not None:
        return {"mail": pb.MailSource(address=args.mail, max_chain_depth=args.max_chain_depth)}
    return {
        "mail_push": pb.MailPushSource(
            history_url=args.mail_push,
            start_history_id=args.start_history_id,
            max_chain_depth=args.max_chain_depth,
            connection_id=args.connection,
        )
    }


# --- handlers ---------------------------------------------------------------------------------


class _Stub:
    def __init__(self, args: argparse.Namespace) -> None:
        self.channel = credentials.channel(args.address, credentials.api_key())
        self.stub = trigger_pb2_grpc.TriggerServiceStub(self.channel)
        self.ws = args.workspace

    def __enter__(self) -> trigger_pb2_grpc.TriggerServiceStub:
        return self.stub

    def __exit__(self, *exc: object) -> None:
        self.channel.close()


def _print(args: argparse.Namespace, value: Any, lines: list[str]) -> None:
    output.emit(args, value, lines)


def create(args: argparse.Namespace) -> int:
    req = pb.CreateTriggerRequest(
        workspace_id=args.workspace,
        trigger_id=args.trigger_id,
        agent_id=args.agent,
        filters=args.filters or [],
        secret=args.secret,
        priority=args.priority,
        publish_event=args.publish_event,
        **_key_rule(args),
        **_source(args),
    )
    with _Stub(args) as stub:
        resp = stub.CreateTrigger(req, timeout=TIMEOUT)
    lines = trigger_lines(resp.trigger)
    if resp.secret:
        lines.append(f"signing secret (shown once): {resp.secret}")
    _print(args, resp, lines)
    return 0


def _all(
    stub: trigger_pb2_grpc.TriggerServiceStub, args: argparse.Namespace
) -> Iterator[pb.Trigger]:
    req = pb.ListTriggersRequest(workspace_id=args.workspace, agent_id=args.agent or "")
    while True:
        resp = stub.ListTriggers(req, timeout=TIMEOUT)
        yield from resp.triggers
        if not resp.next_page_token:
            return
        req.page_token = resp.next_page_token


COLUMNS = [
    Column("trigger", lambda t: t.trigger_id),
    Column("agent", lambda t: t.agent_id),
    Column("source", source_line),
    Column("url", lambda t: t.url),
]


def list_triggers(args: argparse.Namespace) -> int:
    with _Stub(args) as stub:
        found = list(_all(stub, args))
    empty = (
        f"no triggers in workspace {args.workspace!r}: `agentrun triggers create ID --agent A "
        "--webhook stripe` (or --cron, --mail) starts runs from events"
    )
    output.emit_list(args, found, COLUMNS, empty)
    return 0


def show(args: argparse.Namespace) -> int:
    with _Stub(args) as stub:
        t = stub.GetTrigger(
            pb.GetTriggerRequest(workspace_id=args.workspace, trigger_id=args.trigger_id),
            timeout=TIMEOUT,
        ).trigger
    _print(args, t, trigger_lines(t))
    return 0


def events(args: argparse.Namespace) -> int:
    req = pb.ListTriggerEventsRequest(
        workspace_id=args.workspace, trigger_id=args.trigger_id, page_size=min(args.limit, 500)
    )
    with _Stub(args) as stub:
        found = list(stub.ListTriggerEvents(req, timeout=TIMEOUT).events)[: args.limit]
    output.emit(args, found, map(event_line, found))
    if not found:
        output.note(f"no events for trigger {args.trigger_id!r} yet")
    return 0


def rotate(args: argparse.Namespace) -> int:
    req = pb.RotateTriggerSecretRequest(
        workspace_id=args.workspace, trigger_id=args.trigger_id, secret=args.secret
    )
    if args.grace is not None:
        req.grace.CopyFrom(_seconds(args.grace))
    with _Stub(args) as stub:
        resp = stub.RotateTriggerSecret(req, timeout=TIMEOUT)
    _print(
        args,
        resp,
        [*trigger_lines(resp.trigger), f"new signing secret (shown once): {resp.secret}"],
    )
    return 0


def set_enabled(args: argparse.Namespace) -> int:
    req = pb.SetTriggerEnabledRequest(
        workspace_id=args.workspace, trigger_id=args.trigger_id, enabled=args.enabled
    )
    with _Stub(args) as stub:
        t = stub.SetTriggerEnabled(req, timeout=TIMEOUT).trigger
    _print(args, t, trigger_lines(t))
    return 0


# --- the parser -------------------------------------------------------------------------------


def _key_options(p: argparse.ArgumentParser) -> None:
    """triggers create's concurrency_key: the path, the limit and the optional rate."""
    p.add_argument(
        "--concurrency-key",
        default="",
        metavar="input.PATH",
        help="cap the runs it starts per value of this input path (overrides the agent's key)",
    )
    p.add_argument(
        "--key-limit", type=argtypes.int32, default=0, metavar="N", help="runs per key at once"
    )
    p.add_argument(
        "--key-rate", type=key_rate, metavar="RUNS/SECONDS", help="slot grants per key, e.g. 10/60"
    )


def _create_parser(actions: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = actions.add_parser("create", help="create a trigger for an agent", parents=[common])
    p.add_argument("trigger_id", metavar="ID")
    p.add_argument("--agent", required=True, metavar="A")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--webhook", choices=SCHEMES, help="signed HTTP deliveries with this scheme"
    )
    source.add_argument("--cron", metavar="EXPR", help="five-field cron expression")
    source.add_argument("--every", type=durations.arg, metavar="DURATION", help="interval schedule")
    source.add_argument("--mail", nargs="?", const="", metavar="ADDRESS", help="inbound mail")
    source.add_argument("--mail-push", metavar="HISTORY_URL", help="push notifications + fetch")
    p.add_argument("--time-zone", default="", metavar="TZ", help="IANA zone of --cron")
    p.add_argument(
        "--jitter", type=durations.arg, default=0.0, metavar="DURATION", help="spread window"
    )
    p.add_argument("--input", default="", metavar="TEXT", help="schedules: the run's input")
    p.add_argument("--secret", default="", help="the sender's signing secret (default: generate)")
    p.add_argument(
        "--publish-event",
        default="",
        metavar="NAME",
        help="webhooks: publish each delivery as this event instead of starting a run",
    )
    p.add_argument("--tolerance", type=durations.arg, metavar="DURATION", help="replay window")
    p.add_argument("--untimed", action="store_true", help="hmac: sign the body alone")
    p.add_argument("--max-chain-depth", type=argtypes.int32, default=0, metavar="N")
    p.add_argument("--start-history-id", type=argtypes.int64, default=0, metavar="N")
    p.add_argument(
        "--connection", default="", metavar="ID", help="mail push: fetch with this connection"
    )
    p.add_argument("--debounce-key", default="", metavar="PATH", help="body path or header:NAME")
    p.add_argument(
        "--debounce-seconds", type=argtypes.int32, default=0, metavar="S", help="quiet period"
    )
    p.add_argument(
        "--batch-size", type=argtypes.int32, default=0, metavar="N", help="events per run"
    )
    p.add_argument(
        "--batch-seconds", type=argtypes.int32, default=0, metavar="S", help="longest batch wait"
    )
    add_priority(p)
    _key_options(p)
    p.add_argument(
        "--filter",
        dest="filters",
        action="append",
        type=parse_filter,
        metavar="'FIELD OP [VALUE]'",
        help="repeat for more; all must pass",
    )
    schedules.add_schedule_options(p)
    p.set_defaults(handler=create)


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    actions = sub.add_parser(
        "triggers", help="webhooks, schedules, inbound mail and push sources"
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    _create_parser(actions, common)
    p = actions.add_parser("list", help="the workspace's triggers", parents=[common])
    p.add_argument("--agent", default="", metavar="A")
    p.set_defaults(handler=list_triggers)
    p = actions.add_parser("show", help="one trigger", parents=[common])
    p.add_argument("trigger_id", metavar="ID")
    p.set_defaults(handler=show)
    p = actions.add_parser("events", help="a trigger's events, newest first", parents=[common])
    p.add_argument("trigger_id", metavar="ID")
    p.add_argument("--limit", type=argtypes.int32, default=50, metavar="N")
    p.set_defaults(handler=events)
    p = actions.add_parser("rotate-secret", help="add a new signing secret", parents=[common])
    p.add_argument("trigger_id", metavar="ID")
    p.add_argument("--secret", default="", help="the new secret (default: generate)")
    p.add_argument(
        "--grace", type=durations.arg, metavar="DURATION", help="old secret valid (default 24h)"
    )
    p.set_defaults(handler=rotate)
    for name, enabled in (("enable", True), ("disable", False)):
        p = actions.add_parser(name, help=f"{name} a trigger", parents=[common])
        p.add_argument("trigger_id", metavar="ID")
        p.set_defaults(handler=set_enabled, enabled=enabled)
    schedules.add_commands(actions, common)
