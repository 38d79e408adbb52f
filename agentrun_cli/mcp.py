"""`agentrun tools add-mcp|sync`: a workspace's remote MCP servers and their tools.

    agentrun tools add-mcp desk https://mcp.example/mcp --connection desk \\
        --class add_note=provider_key:idempotency_key
    agentrun tools sync desk                      # the diff against the registry
    agentrun tools sync desk --apply --class create_ticket=none
    agentrun tools sync desk --apply --expect 3f2a9c01d4e5b6a7   # exactly the diff shown

`sync --apply` at a terminal shows the diff and asks before it saves it (`--yes` does not
ask); either way it saves only the diff that was shown (`--expect DIGEST`: the one a
plain `sync` printed; the server's tools changed since: nothing saved). A removed tool is
retired when applied: no longer listed nor publishable, agent versions that pinned it
keep their version.

The server's annotations only propose a write's class; a write is saved once a person
states it with `--class TOOL=none` (a lost answer goes to a person) or
`--class TOOL=provider_key:ARG` (the server dedupes on argument ARG, which the executor
fills with the call's idempotency key). Until then it is listed as pending.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import grpc

from agentrun.v1 import tool_pb2 as pb
from agentrun.v1 import tool_pb2_grpc
from agentrun_cli import credentials, durations, output

TIMEOUT = 60.0  # the control plane asks the MCP server while we wait
_CLASSES = {"none": pb.IDEMPOTENCY_CLASS_NONE, "provider_key": pb.IDEMPOTENCY_CLASS_PROVIDER_KEY}
_MARK = {
    pb.ToolChange.KIND_ADDED: "+",
    pb.ToolChange.KIND_CHANGED: "~",
    pb.ToolChange.KIND_REMOVED: "-",
}


def write_class(text: str) -> tuple[str, pb.WriteClass]:
    """`TOOL=none` or `TOOL=provider_key:ARG` (argparse type)."""
    tool, _, spec = text.partition("=")
    kind, _, argument = spec.partition(":")
    if not tool or kind not in _CLASSES or (kind == "provider_key") != bool(argument):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected TOOL=none or TOOL=provider_key:ARGUMENT"
        )
    return tool, pb.WriteClass(idempotency=_CLASSES[kind], idempotency_header=argument)


def _classes(given: Sequence[tuple[str, pb.WriteClass]] | None) -> dict[str, pb.WriteClass]:
    return dict(given or [])


def _stub(args: argparse.Namespace) -> tuple[grpc.Channel, tool_pb2_grpc.McpServerServiceStub]:
    channel = credentials.channel(args.address, credentials.api_key("admin"))
    return channel, tool_pb2_grpc.McpServerServiceStub(channel)


def class_name(value: int) -> str:
    return pb.IdempotencyClass.Name(value).removeprefix("IDEMPOTENCY_CLASS_").lower()


def change_line(change: pb.ToolChange) -> str:
    """`+ desk__create_ticket  write, proposed none: needs --class` and the like."""
    text = f"{_MARK.get(change.kind, '?')} {change.name}"
    if change.fields:
        text += f"  {', '.join(change.fields)}"
    tool = change.proposed
    if change.kind == pb.ToolChange.KIND_REMOVED:
        return text + "  no longer listed: applying retires it"
    text += "  read" if tool.access == pb.TOOL_ACCESS_READ else "  write"
    if change.needs_class:
        text += f", proposed {class_name(change.proposed_class)}: needs --class"
    elif tool.access == pb.TOOL_ACCESS_WRITE and tool.idempotency:
        text += f" ({class_name(tool.idempotency)})"
    return text


def tool_line(tool: pb.Tool) -> str:
    if tool.retired:
        return f"retired {tool.name} v{tool.version}"
    kind = "read" if tool.access == pb.TOOL_ACCESS_READ else "write"
    if tool.access == pb.TOOL_ACCESS_WRITE:
        kind += f" ({class_name(tool.idempotency)})"
        if tool.mcp.key_argument:
            kind += f", key in {tool.mcp.key_argument}"
    return f"saved {tool.name} v{tool.version}  {kind}"


def tools_add_mcp(args: argparse.Namespace) -> int:
    req = pb.AddMcpServerRequest(
        workspace_id=args.workspace,
        server_id=args.server_id,
        url=args.url,
        connection=args.connection or "",
        classes=_classes(args.classes),
        timeout_seconds=args.timeout or 0.0,
    )
    channel, stub = _stub(args)
    with channel:
        resp = stub.AddMcpServer(req, timeout=TIMEOUT)
    lines = [f"added MCP server {resp.server.server_id} ({resp.server.url})"]
    lines += [tool_line(t) for t in resp.tools]
    lines += [f"pending {change_line(c)}" for c in resp.pending]
    if resp.pending:
        lines.append(
            f"state their classes: agentrun tools sync {args.server_id} --apply "
            "--class TOOL=none|provider_key:ARG"
        )
    output.emit(args, resp, lines)
    return 0


def tools_sync(args: argparse.Namespace) -> int:
    req = pb.SyncMcpServerRequest(
        workspace_id=args.workspace,
        server_id=args.server_id,
        classes=_classes(args.classes),
        expect_digest=args.expect or "",
        timeout_seconds=args.timeout or 0.0,
    )
    channel, stub = _stub(args)
    with channel:
        if args.apply and not (args.expect or args.yes) and sys.stdin.isatty():
            shown = stub.SyncMcpServer(req, timeout=TIMEOUT)
            if not _confirmed(args.server_id, shown):
                return 1
            req.expect_digest = shown.digest
        req.apply = args.apply
        resp = stub.SyncMcpServer(req, timeout=TIMEOUT)
    lines = [change_line(c) for c in resp.changes] or [f"{args.server_id}: no changes"]
    lines += [tool_line(t) for t in resp.tools]
    if resp.changes and not args.apply:
        lines.append(
            f"nothing saved: apply exactly this diff with agentrun tools sync "
            f"{args.server_id} --apply --expect {resp.digest}"
        )
    output.emit(args, resp, lines)
    return 0


def _confirmed(server_id: str, shown: pb.SyncMcpServerResponse) -> bool:
    """Show the diff on stderr and ask whether to save it (a terminal only)."""
    if not shown.changes:
        return True
    for change in shown.changes:
        output.note(change_line(change))
    answer = input(f"save these {len(shown.changes)} changes of {server_id}? [y/N] ")
    if answer.strip().lower() in ("y", "yes"):
        return True
    output.note("nothing saved")
    return False


def _tools_actions(sub: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """The `tools` command's actions (the registry's own module may have made it already)."""
    parser = sub.choices.get("tools") or sub.add_parser("tools", help="the workspace's tools")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return parser.add_subparsers(dest="action", required=True, metavar="ACTION")


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    actions = _tools_actions(sub)
    class_help = "a write's class: TOOL=none or TOOL=provider_key:ARG (repeatable)"
    p = actions.add_parser(
        "add-mcp", help="register a remote MCP server and snapshot its tools", parents=[common]
    )
    p.add_argument("server_id", metavar="SERVER_ID", help="lowercase id, e.g. desk")
    p.add_argument("url", metavar="URL", help="its streamable HTTP endpoint")
    p.add_argument("--connection", metavar="PROVIDER", help="the connection that authenticates")
    p.add_argument(
        "--timeout",
        type=durations.arg,
        metavar="DURATION",
        help="each call's deadline, up to 300s (default: the platform's)",
    )
    p.add_argument(
        "--class",
        dest="classes",
        action="append",
        type=write_class,
        metavar="TOOL=CLASS",
        help=class_help,
    )
    p.set_defaults(handler=tools_add_mcp)
    p = actions.add_parser(
        "sync", help="re-read an MCP server's tools: the diff, or --apply it", parents=[common]
    )
    p.add_argument("server_id", metavar="SERVER_ID")
    p.add_argument(
        "--apply",
        action="store_true",
        help="save the diff (at a terminal: after showing it and asking)",
    )
    p.add_argument(
        "--expect",
        metavar="DIGEST",
        help="apply only the diff a plain sync printed with this digest",
    )
    p.add_argument("--yes", action="store_true", help="with --apply: do not ask")
    p.add_argument(
        "--timeout",
        type=durations.arg,
        metavar="DURATION",
        help="a new deadline for each call, up to 300s",
    )
    p.add_argument(
        "--class",
        dest="classes",
        action="append",
        type=write_class,
        metavar="TOOL=CLASS",
        help=class_help,
    )
    p.set_defaults(handler=tools_sync)
