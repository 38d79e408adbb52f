"""`agentrun tools create|list|show`: the workspace's tool registry (its own and the built-ins).

`import-openapi`, `add-mcp` and `sync` are added to the same `tools` group by their modules
(openapi_import.py, mcp.py: their `add_commands`), which build on this one; parser.py calls
them after this module's `add_commands`.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import grpc

from agentrun.v1 import tool_pb2, tool_pb2_grpc
from agentrun_cli import argtypes, credentials, output, render, tool_files
from agentrun_cli.output import Column

TIMEOUT = 30.0
_CLASS = {
    tool_pb2.IDEMPOTENCY_CLASS_PROVIDER_KEY: "provider_key",
    tool_pb2.IDEMPOTENCY_CLASS_LOOKUP: "lookup",
    tool_pb2.IDEMPOTENCY_CLASS_NONE: "none",
}
_ACCESS = {
    tool_pb2.TOOL_ACCESS_READ: "read",
    tool_pb2.TOOL_ACCESS_WRITE: "write",
    tool_pb2.TOOL_ACCESS_INTERNAL: "internal",
}


def stub(args: argparse.Namespace) -> tuple[grpc.Channel, tool_pb2_grpc.ToolServiceStub]:
    channel = credentials.channel(args.address, credentials.api_key("admin"))
    return channel, tool_pb2_grpc.ToolServiceStub(channel)


def kind(tool: tool_pb2.Tool) -> str:
    """`read`, `write (provider_key)`, ... ."""
    access = _ACCESS.get(tool.access, "?")
    return f"{access} ({_CLASS.get(tool.idempotency, 'none')})" if access == "write" else access


def transport(tool: tool_pb2.Tool) -> str:
    if tool.HasField("http"):
        return f"{tool.http.method} {tool.http.url}"
    if tool.HasField("mcp"):
        return f"mcp {tool.mcp.server_id}/{tool.mcp.tool}"
    return "built-in"


COLUMNS = [
    Column("tool", lambda t: t.name),
    Column("version", lambda t: f"v{t.version}", right=True),
    Column("kind", kind),
    Column("source", lambda t: t.source),
    Column("calls", transport),
]


def lines(tool: tool_pb2.Tool) -> list[str]:
    owner = "shared built-in" if tool.builtin else f"workspace {tool.workspace_id}"
    found = [
        f"{tool.name} v{tool.version}  {kind(tool)}  ({owner}, source {tool.source}, "
        f"saved by {tool.created_by} {render.timestamp(tool.create_time)})",
        "  retired: its MCP server no longer lists it (not offered; pinned versions stay)"
        if tool.retired
        else "",
        f"  {tool.description}" if tool.description else "",
        f"  calls: {transport(tool)}",
        f"  connection: {tool.connection or '-'}"
        + (f" ({tool.http.auth})" if tool.HasField("http") and tool.http.auth else ""),
        f"  capabilities: {', '.join(tool.capabilities) or '-'}",
        f"  arguments: {tool.parameters_json}",
    ]
    return [line for line in found if line]


def tools_create(args: argparse.Namespace) -> int:
    """Save each tool of the file as a new version (nothing when it equals the latest)."""
    loaded = tool_files.load(args.file)
    channel, tools = stub(args)
    saved = []
    with channel:
        for tool in loaded:
            tool.source = "file"
            request = tool_pb2.CreateToolRequest(workspace_id=args.workspace, tool=tool)
            saved.append(tools.CreateTool(request, timeout=TIMEOUT))
    said = [
        f"created tool {r.tool.name} v{r.tool.version}"
        if r.created
        else f"{r.tool.name} v{r.tool.version} already has this definition; nothing saved"
        for r in saved
    ]
    output.emit(args, saved if len(saved) > 1 else saved[0], said)
    return 0


def listed(tools: tool_pb2_grpc.ToolServiceStub, workspace: str) -> Iterator[tool_pb2.Tool]:
    token = ""
    while True:
        request = tool_pb2.ListToolsRequest(workspace_id=workspace, page_token=token)
        page = tools.ListTools(request, timeout=TIMEOUT)
        yield from page.tools
        token = page.next_page_token
        if not token:
            return


def tools_list(args: argparse.Namespace) -> int:
    channel, tools = stub(args)
    with channel:
        found = list(listed(tools, args.workspace))
    output.emit_list(args, found, COLUMNS, "no tools (not even the built-ins?)")
    return 0


def tools_show(args: argparse.Namespace) -> int:
    channel, tools = stub(args)
    request = tool_pb2.GetToolRequest(
        workspace_id=args.workspace, name=args.name, version=args.version
    )
    with channel:
        tool = tools.GetTool(request, timeout=TIMEOUT).tool
    output.emit(args, tool, lines(tool))
    return 0


def add_commands(
    sub: argparse._SubParsersAction, common: argparse.ArgumentParser
) -> argparse._SubParsersAction:
    """The `tools` group; returns its subcommands for the importers to add theirs to."""
    actions = sub.add_parser(
        "tools", help="the workspace's tools: HTTP templates, imports, built-ins"
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    p = actions.add_parser(
        "create",
        help="save the tools of a YAML/JSON file (a new version if changed)",
        parents=[common],
    )
    p.add_argument("-f", "--file", required=True, metavar="FILE", help="tool file (- = stdin)")
    p.set_defaults(handler=tools_create)
    p = actions.add_parser("list", help="the latest version of every tool", parents=[common])
    p.set_defaults(handler=tools_list)
    p = actions.add_parser("show", help="one tool's definition", parents=[common])
    p.add_argument("name", metavar="NAME")
    p.add_argument("--version", type=argtypes.int32, default=0, metavar="N", help="default: latest")
    p.set_defaults(handler=tools_show)
    return actions
