"""`agentrun approvals list|show|approve|reject|edit`: deciding held tool calls from a terminal."""

from __future__ import annotations

import argparse
import json

import grpc

from agentrun.v1 import approval_pb2, approval_pb2_grpc
from agentrun_cli import credentials, output, render
from agentrun_cli.output import Column

STATES = {
    "pending": approval_pb2.APPROVAL_STATE_PENDING,
    "approved": approval_pb2.APPROVAL_STATE_APPROVED,
    "rejected": approval_pb2.APPROVAL_STATE_REJECTED,
    "edited": approval_pb2.APPROVAL_STATE_EDITED,
    "expired": approval_pb2.APPROVAL_STATE_EXPIRED,
    "closed": approval_pb2.APPROVAL_STATE_CLOSED,
}
TIMEOUT = 30.0


def _stub(args: argparse.Namespace) -> tuple[grpc.Channel, approval_pb2_grpc.ApprovalServiceStub]:
    # --token (a signed-in person's ID token) is sent per call; else the API key
    # (AGENTRUN_API_KEY, or the dev stack's approver key).
    key = None if getattr(args, "token", None) else credentials.api_key("approver")
    channel = credentials.channel(args.address, key)
    return channel, approval_pb2_grpc.ApprovalServiceStub(channel)


def _metadata(args: argparse.Namespace) -> list[tuple[str, str]]:
    token = getattr(args, "token", None)
    return [("authorization", f"Bearer {token}")] if token else []


def line(a: approval_pb2.Approval) -> str:
    state = approval_pb2.ApprovalState.Name(a.state).removeprefix("APPROVAL_STATE_").lower()
    who = f" by {a.decided_by}" if a.decided_by else f" (approvers: {', '.join(a.approvers)})"
    risk = " HIGH-RISK" if a.high_risk else ""
    risk += " UNTRUSTED-VALUES" if a.argument_origins else ""
    return f"{a.approval_id}  {state:<8} {a.tool}{risk} run {a.run_id}{who}"


def details(a: approval_pb2.Approval) -> list[str]:
    out = [line(a), f"  arguments  {a.arguments_json}", f"  sha256     {a.arguments_sha256}"]
    if a.edited_arguments_json:
        out.append(f"  edited to  {a.edited_arguments_json}")
    if a.reason:
        out.append(f"  reason     {a.reason}")
    if a.argument_origins:
        out.append("  WARNING    these values came from untrusted content, not from a person:")
        out.extend(f"  origin     {o.argument} {o.value}: {o.summary}" for o in a.argument_origins)
    return out


def _state(a: approval_pb2.Approval) -> str:
    return approval_pb2.ApprovalState.Name(a.state).removeprefix("APPROVAL_STATE_").lower()


COLUMNS = [
    Column("approval id", lambda a: a.approval_id),
    Column("state", _state),
    Column(
        "tool",
        lambda a: (
            a.tool
            + (" (high risk)" if a.high_risk else "")
            + (" (untrusted values)" if a.argument_origins else "")
        ),
    ),
    Column("arguments", lambda a: render.short(json.loads(a.arguments_json or "null"), 50)),
    Column("run id", lambda a: a.run_id),
    Column("created", lambda a: render.timestamp(a.create_time)),
    Column("expires", lambda a: render.timestamp(a.expire_time)),
    Column("approvers / by", lambda a: a.decided_by or ", ".join(a.approvers)),
]


def approvals_list(args: argparse.Namespace) -> int:
    channel, stub = _stub(args)
    with channel:
        req = approval_pb2.ListApprovalsRequest(
            workspace_id=args.workspace,
            approver=args.approver or "",
            state=STATES.get(args.state, 0),
            page_size=100,
        )
        approvals = list(stub.ListApprovals(req, timeout=TIMEOUT).approvals)
    if args.quiet:
        for a in approvals:
            print(a.approval_id)
        return 0
    whose = f" for {args.approver}" if args.approver else ""
    empty = (
        f"no {args.state} approvals{whose} in workspace {args.workspace!r}: a run asks for one "
        "when its agent's policy (approval.tools) or the tool's class holds a call"
    )
    output.emit_list(args, approvals, COLUMNS, empty)
    return 0


def approvals_show(args: argparse.Namespace) -> int:
    channel, stub = _stub(args)
    with channel:
        resp = stub.GetApproval(
            approval_pb2.GetApprovalRequest(workspace_id=args.workspace, approval_id=args.id),
            timeout=TIMEOUT,
        )
    output.emit(args, resp.approval, details(resp.approval))
    return 0


def _decide(args: argparse.Namespace, **decision: object) -> int:
    channel, stub = _stub(args)
    req = approval_pb2.DecideApprovalRequest(
        workspace_id=args.workspace, approval_id=args.id, approver=args.approver, **decision
    )
    with channel:
        resp = stub.DecideApproval(req, timeout=TIMEOUT, metadata=_metadata(args))
    output.emit(args, resp.approval, details(resp.approval))
    return 0


def approvals_approve(args: argparse.Namespace) -> int:
    return _decide(args, approve=approval_pb2.Approve())


def approvals_reject(args: argparse.Namespace) -> int:
    return _decide(args, reject=approval_pb2.Reject(reason=args.reason))


def approvals_edit(args: argparse.Namespace) -> int:
    try:
        json.loads(args.arguments)
    except ValueError as exc:
        raise SystemExit(f"error: --arguments is not JSON: {exc}") from None
    except RecursionError:
        raise SystemExit("error: --arguments is nested too deeply") from None
    return _decide(args, edit=approval_pb2.Edit(arguments_json=args.arguments, note=args.note))


def _decision_parser(
    actions, name: str, help_text: str, common, handler
) -> argparse.ArgumentParser:
    p = actions.add_parser(name, help=help_text, parents=[common])
    p.add_argument("id", metavar="APPROVAL_ID")
    p.add_argument(
        "--approver", default="", help="deprecated: you decide as your credential's principal"
    )
    p.add_argument(
        "--token",
        default=None,
        help="a sign-in ID token (money-moving and high-risk tools need a signed-in approver)",
    )
    p.set_defaults(handler=handler)
    return p


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    actions = sub.add_parser("approvals", help="list and decide approvals").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    p = actions.add_parser("list", help="approvals, newest first", parents=[common])
    p.add_argument("--approver", default="")
    p.add_argument("--state", choices=sorted(STATES), default="pending")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the approval ids")
    p.set_defaults(handler=approvals_list)
    p = actions.add_parser("show", help="one approval with its exact arguments", parents=[common])
    p.add_argument("id", metavar="APPROVAL_ID")
    p.set_defaults(handler=approvals_show)
    _decision_parser(actions, "approve", "run the call as proposed", common, approvals_approve)
    p = _decision_parser(
        actions, "reject", "refuse it (the model sees why)", common, approvals_reject
    )
    p.add_argument("--reason", default="rejected")
    p = _decision_parser(actions, "edit", "run it with other arguments", common, approvals_edit)
    p.add_argument("--arguments", required=True, help="the arguments to run, a JSON object")
    p.add_argument("--note", default="")
