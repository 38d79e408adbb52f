"""`agentrun channels add|list|remove`: where a workspace's notifications go (issue 43).

Secrets never go on the command line (shell history, `ps`): a Slack bot token, an SMTP
password or a webhook signing secret is read from the environment variable that
`--secret-env` names (default AGENTRUN_CHANNEL_SECRET). A webhook added without one gets
a secret made by the server, printed once.
"""

from __future__ import annotations

import argparse
import os

import grpc

from agentrun.v1 import channel_pb2 as pb
from agentrun.v1 import channel_pb2_grpc
from agentrun_cli import credentials, output

TIMEOUT = 30.0
SECRET_ENV = "AGENTRUN_CHANNEL_SECRET"


def _stub(args: argparse.Namespace) -> tuple[grpc.Channel, channel_pb2_grpc.ChannelServiceStub]:
    channel = credentials.channel(args.address, credentials.api_key("admin"))
    return channel, channel_pb2_grpc.ChannelServiceStub(channel)


def line(c: pb.Channel) -> str:
    return f"{c.name:<16} {c.kind:<8} {c.target}  {c.channel_id}"


def _secret(args: argparse.Namespace) -> str:
    return os.environ.get(args.secret_env, "")


def _request(args: argparse.Namespace) -> pb.AddChannelRequest:
    req = pb.AddChannelRequest(workspace_id=args.workspace, name=args.name)
    if args.kind == "slack":
        req.slack.CopyFrom(pb.SlackChannel(api_url=args.api_url or "", bot_token=_secret(args)))
    elif args.kind == "email":
        req.email.CopyFrom(
            pb.EmailChannel(
                host=args.host or "",
                port=args.port or 0,
                sender=args.sender or "",
                username=args.username or "",
                password=_secret(args),
                tls=args.tls or "",
            )
        )
    else:
        req.webhook.CopyFrom(
            pb.WebhookChannel(
                url=args.url or "",
                secret=_secret(args),
                events=args.event or [],
                agent_id=args.agent or "",
            )
        )
    return req


def channels_add(args: argparse.Namespace) -> int:
    channel, stub = _stub(args)
    with channel:
        resp = stub.AddChannel(_request(args), timeout=TIMEOUT)
    output.emit(args, resp.channel, [line(resp.channel)])
    if resp.webhook_secret:
        output.note(f"signing secret (shown once; verify webhooks with it): {resp.webhook_secret}")
    return 0


def channels_list(args: argparse.Namespace) -> int:
    channel, stub = _stub(args)
    with channel:
        resp = stub.ListChannels(
            pb.ListChannelsRequest(workspace_id=args.workspace), timeout=TIMEOUT
        )
    found = list(resp.channels)
    output.emit(args, found, map(line, found))
    if not found:
        output.note(
            f"no channels in workspace {args.workspace!r}: notifications go to the deployment's "
            "notifier; `agentrun channels add slack|email|webhook NAME` adds one"
        )
    return 0


def channels_remove(args: argparse.Namespace) -> int:
    channel, stub = _stub(args)
    with channel:
        stub.RemoveChannel(
            pb.RemoveChannelRequest(workspace_id=args.workspace, name=args.name), timeout=TIMEOUT
        )
    output.note(f"removed channel {args.name!r}")
    return 0


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    actions = sub.add_parser("channels", help="where notifications go").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    p = actions.add_parser("add", help="add a Slack, e-mail or webhook channel", parents=[common])
    p.add_argument("kind", choices=("slack", "email", "webhook"))
    p.add_argument("name", metavar="NAME")
    p.add_argument("--api-url", help="slack: the Web API's base URL (default Slack's)")
    p.add_argument("--host", help="email: the SMTP server")
    p.add_argument("--port", type=int, help="email: its port (default by --tls)")
    p.add_argument("--sender", help="email: the From address")
    p.add_argument("--username", help="email: the SMTP login")
    p.add_argument("--tls", choices=("starttls", "tls", "none"), help="email: default starttls")
    p.add_argument("--url", help="webhook: where to POST")
    p.add_argument(
        "--event",
        action="append",
        metavar="EVENT",
        help="webhook: also run.completed / run.failed of every run (repeatable)",
    )
    p.add_argument("--agent", metavar="AGENT", help="webhook: those events of this agent only")
    p.add_argument(
        "--secret-env",
        default=SECRET_ENV,
        metavar="VAR",
        help=f"the variable holding the bot token, SMTP password or signing secret ({SECRET_ENV})",
    )
    p.set_defaults(handler=channels_add)
    p = actions.add_parser("list", help="the workspace's channels", parents=[common])
    p.set_defaults(handler=channels_list)
    p = actions.add_parser("remove", help="remove a channel", parents=[common])
    p.add_argument("name", metavar="NAME")
    p.set_defaults(handler=channels_remove)
