"""`agentrun connections list|show|revoke|link|reconnect`: a workspace's connected accounts (never tokens)."""

from __future__ import annotations

import argparse

import grpc

from agentrun.v1 import connection_pb2 as pb
from agentrun.v1 import connection_pb2_grpc
from agentrun_cli import credentials, output

TIMEOUT = 30.0


def _stub(
    args: argparse.Namespace,
) -> tuple[grpc.Channel, connection_pb2_grpc.ConnectionServiceStub]:
    channel = credentials.channel(args.address, credentials.api_key("admin"))
    return channel, connection_pb2_grpc.ConnectionServiceStub(channel)


def line(c: pb.Connection) -> str:
    why = f" ({c.status_reason})" if c.status_reason else ""
    return (
        f"{c.connection_id}  {c.provider:<9} {c.account}  {c.status}{why}  "
        f"scopes {' '.join(c.scopes) or '-'}  owner {c.owner}"
    )


def _show(args: argparse.Namespace, connection: pb.Connection) -> None:
    output.emit(args, connection, [line(connection)])


def connections_list(args: argparse.Namespace) -> int:
    channel, stub = _stub(args)
    with channel:
        resp = stub.ListConnections(
            pb.ListConnectionsRequest(workspace_id=args.workspace), timeout=TIMEOUT
        )
    connections = list(resp.connections)
    empty = (
        f"no connections in workspace {args.workspace!r}: `agentrun connections connect PROVIDER` "
        "links an account"
    )
    output.emit(args, connections, map(line, connections))
    if not connections:
        output.note(empty)
    return 0


def connections_show(args: argparse.Namespace) -> int:
    channel, stub = _stub(args)
    req = pb.GetConnectionRequest(workspace_id=args.workspace, connection_id=args.id)
    with channel:
        _show(args, stub.GetConnection(req, timeout=TIMEOUT).connection)
    return 0


def connections_revoke(args: argparse.Namespace) -> int:
    channel, stub = _stub(args)
    req = pb.RevokeConnectionRequest(workspace_id=args.workspace, connection_id=args.id)
    with channel:
        _show(args, stub.RevokeConnection(req, timeout=TIMEOUT).connection)
    return 0


def connections_link(args: argparse.Namespace) -> int:
    channel, stub = _stub(args)
    req = pb.GetReconnectLinkRequest(workspace_id=args.workspace, connection_id=args.id)
    with channel:
        print(stub.GetReconnectLink(req, timeout=TIMEOUT).url)
    return 0


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    actions = sub.add_parser("connections", help="connected accounts").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    p = actions.add_parser("list", help="the workspace's connections", parents=[common])
    p.set_defaults(handler=connections_list)
    for name, text, handler in (
        ("show", "one connection", connections_show),
        ("revoke", "stop agents using it (runs that need it park)", connections_revoke),
        ("link", "the reconnect link for its owner", connections_link),
        ("reconnect", "the reconnect link for its owner (as link)", connections_link),
    ):
        p = actions.add_parser(name, help=text, parents=[common])
        p.add_argument("id", metavar="CONNECTION_ID")
        p.set_defaults(handler=handler)
