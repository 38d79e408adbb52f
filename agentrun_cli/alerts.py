"""`agentrun alerts add|list|remove`: alert rules that fire once per breach through a channel.

agentrun alerts add failing --channel ops --failure-rate 0.2 --min-finished 10 --window 15m
agentrun alerts add stuck --channel ops --stuck-longer-than 1h
"""

from __future__ import annotations

import argparse

import grpc

from agentrun.v1 import channel_pb2 as pb
from agentrun.v1 import channel_pb2_grpc
from agentrun_cli import credentials, durations, output

TIMEOUT = 30.0


def _stub(args: argparse.Namespace) -> tuple[grpc.Channel, channel_pb2_grpc.ChannelServiceStub]:
    channel = credentials.channel(args.address, credentials.api_key("admin"))
    return channel, channel_pb2_grpc.ChannelServiceStub(channel)


def condition(r: pb.AlertRule) -> str:
    if r.WhichOneof("condition") == "failure_rate":
        f = r.failure_rate
        scope = f.agent_id or "all agents"
        return (
            f"failure rate >= {f.threshold:.0%} of >= {f.min_finished} runs of {scope} "
            f"in {f.window_seconds}s"
        )
    s = r.stuck_on_person
    return f"a run of {s.agent_id or 'all agents'} waiting on a person > {s.waiting_seconds}s"


def line(r: pb.AlertRule) -> str:
    state = "firing" if r.HasField("fire_time") and not r.HasField("resolve_time") else "ok"
    return f"{r.name:<16} {state:<7} via {r.channel:<12} {condition(r)}  fired {r.fire_count}x"


def _rule(args: argparse.Namespace) -> pb.AlertRule:
    rule = pb.AlertRule(
        workspace_id=args.workspace,
        name=args.name,
        channel=args.channel,
        recipient=args.recipient or "",
    )
    if args.failure_rate is not None:
        rule.failure_rate.CopyFrom(
            pb.FailureRate(
                agent_id=args.agent or "",
                threshold=args.failure_rate,
                min_finished=args.min_finished,
                window_seconds=int(args.window),
            )
        )
    else:
        rule.stuck_on_person.CopyFrom(
            pb.StuckOnPerson(agent_id=args.agent or "", waiting_seconds=int(args.stuck_longer_than))
        )
    return rule


def alerts_add(args: argparse.Namespace) -> int:
    channel, stub = _stub(args)
    with channel:
        resp = stub.AddAlertRule(
            pb.AddAlertRuleRequest(workspace_id=args.workspace, rule=_rule(args)), timeout=TIMEOUT
        )
    output.emit(args, resp.rule, [line(resp.rule)])
    return 0


def alerts_list(args: argparse.Namespace) -> int:
    channel, stub = _stub(args)
    with channel:
        resp = stub.ListAlertRules(
            pb.ListAlertRulesRequest(workspace_id=args.workspace), timeout=TIMEOUT
        )
    found = list(resp.rules)
    output.emit(args, found, map(line, found))
    if not found:
        output.note(f"no alert rules in workspace {args.workspace!r}")
    return 0


def alerts_remove(args: argparse.Namespace) -> int:
    channel, stub = _stub(args)
    with channel:
        stub.RemoveAlertRule(
            pb.RemoveAlertRuleRequest(workspace_id=args.workspace, name=args.name), timeout=TIMEOUT
        )
    output.note(f"removed alert rule {args.name!r}")
    return 0


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    actions = sub.add_parser("alerts", help="alert rules, fired through channels").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    p = actions.add_parser("add", help="add an alert rule", parents=[common])
    p.add_argument("name", metavar="NAME")
    p.add_argument("--channel", required=True, metavar="CHANNEL", help="the channel's name")
    p.add_argument("--recipient", metavar="TO", help="slack: #channel; email: the address")
    p.add_argument("--agent", metavar="AGENT", help="runs of this agent only (default all)")
    cond = p.add_mutually_exclusive_group(required=True)
    cond.add_argument("--failure-rate", type=float, metavar="SHARE", help="e.g. 0.2 for 20 %%")
    cond.add_argument(
        "--stuck-longer-than", type=durations.arg, metavar="DURATION", help="waiting on a person"
    )
    p.add_argument("--min-finished", type=int, default=10, metavar="N", help="default 10")
    p.add_argument(
        "--window", type=durations.arg, default=900.0, metavar="DURATION", help="default 15m"
    )
    p.set_defaults(handler=alerts_add)
    p = actions.add_parser("list", help="the workspace's alert rules", parents=[common])
    p.set_defaults(handler=alerts_list)
    p = actions.add_parser("remove", help="remove an alert rule", parents=[common])
    p.add_argument("name", metavar="NAME")
    p.set_defaults(handler=alerts_remove)
