"""`agentrun tools import-openapi FILE`: chosen operations of an OpenAPI 3 document as tools.

    agentrun tools import-openapi shop.yaml --dry-run          # the proposals, nothing saved
    agentrun tools import-openapi shop.yaml --class createOrder=provider_key
    agentrun tools import-openapi api.json --operations getUser,updateUser \\
        --class updateUser=none --base-url https://api.example.com --connection acme

GET and HEAD operations are reads; every other one is a write and is imported only with
`--class OPERATION=provider_key[:Header]` or `OPERATION=none` (a `lookup` class needs how
to ask: say it through the API). A dry run shows what a write documenting an
Idempotency-Key header is proposed as. The control plane converts and validates
(control_plane/tools/openapi.py); a refusal names the field (`classes[createOrder]`).
"""

from __future__ import annotations

import argparse

from agentrun.v1 import tool_pb2
from agentrun_cli import output, tools
from agentrun_cli.output import Column
from agentrun_cli.spec_files import read_text

CLASSES = {
    "provider_key": tool_pb2.IDEMPOTENCY_CLASS_PROVIDER_KEY,
    "none": tool_pb2.IDEMPOTENCY_CLASS_NONE,
}


def write_class(text: str) -> tuple[str, tool_pb2.WriteClass]:
    """`OPERATION=provider_key[:Header]` or `OPERATION=none`, as (operation, WriteClass)."""
    operation, _, stated = text.partition("=")
    kind, _, header = stated.partition(":")
    if not operation or kind not in CLASSES or (header and kind != "provider_key"):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected OPERATION=provider_key[:Header] or OPERATION=none"
        )
    return operation, tool_pb2.WriteClass(idempotency=CLASSES[kind], idempotency_header=header)


def request(args: argparse.Namespace) -> tool_pb2.ImportOpenApiRequest:
    document = read_text(args.file)
    return tool_pb2.ImportOpenApiRequest(
        workspace_id=args.workspace,
        document=document,
        operations=[op for chunk in args.operations or [] for op in chunk.split(",") if op],
        classes=dict(args.classes or []),
        base_url=args.base_url or "",
        connection=args.connection or "",
        auth=args.auth or "",
        dry_run=args.dry_run,
    )


def kind(tool: tool_pb2.Tool) -> str:
    unclassed = tool.access == tool_pb2.TOOL_ACCESS_WRITE and not tool.idempotency
    keyed = f", {tool.idempotency_header}" if tool.idempotency_header else ""
    return "write (needs a class)" if unclassed else tools.kind(tool).replace(")", f"{keyed})")


COLUMNS = [
    Column("tool", lambda t: t.name),
    Column("version", lambda t: f"v{t.version}" if t.version else "proposed", right=True),
    Column("kind", kind),
    Column("calls", tools.transport),
]


def tools_import_openapi(args: argparse.Namespace) -> int:
    channel, stub = tools.stub(args)
    with channel:
        imported = list(stub.ImportOpenApi(request(args), timeout=tools.TIMEOUT).tools)
    output.emit_list(args, imported, COLUMNS, "no operations imported")
    if args.dry_run:
        unclassed = [t.name for t in imported if kind(t) == "write (needs a class)"]
        hint = f"; state the class of {', '.join(unclassed)} with --class" if unclassed else ""
        output.note(f"dry run: nothing saved{hint}")
    return 0


def add_commands(actions: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """`tools import-openapi`, added to the `tools` group (agentrun_cli/tools.py)."""
    p = actions.add_parser(
        "import-openapi",
        parents=[common],
        help="import operations of an OpenAPI 3 document as tools (a write needs --class)",
    )
    p.add_argument("file", metavar="FILE", help="the document, JSON or YAML (- = stdin)")
    p.add_argument(
        "--operations", action="append", metavar="A,B", help="operationIds to import (default: all)"
    )
    p.add_argument(
        "--class",
        dest="classes",
        action="append",
        type=write_class,
        metavar="OP=provider_key[:Header]|none",
        help="a write's idempotency class (once per write)",
    )
    p.add_argument("--base-url", metavar="URL", help="default: the document's first server")
    p.add_argument(
        "--connection",
        metavar="PROVIDER",
        help='the connection supplying credentials ("trigger": the run\'s account)',
    )
    p.add_argument(
        "--auth",
        metavar="HOW",
        help='"bearer" or "header:<Name>" (default: the operation\'s security scheme)',
    )
    p.add_argument("--dry-run", action="store_true", help="show the tools; save nothing")
    p.set_defaults(handler=tools_import_openapi)
