"""`agentrun workspaces|apikeys|members|audit`: the WorkspaceAdminService from the shell.

    agentrun workspaces create acme --plan team          # a platform admin key
    agentrun workspaces set-plan acme enterprise --max-concurrency 200
    agentrun workspaces set-retention 30               # finished runs kept 30 days (0: forever)
    agentrun workspaces set-approval-watch 20 1h 30s   # 20 approvals in 1h, each in 30s: flagged
    agentrun workspaces set-allowlist payees GB33BUKB20201555555555   # value_allowed's list
    agentrun apikeys create --role operator --name ci-bot --expires-in 90d   # shown once
    agentrun apikeys create --executor --name gpu-pool --scope acme,globex   # platform key
    agentrun apikeys list
    agentrun apikeys revoke 0123456789abcdef
    agentrun members add ada@example.com --role approver
    agentrun audit --limit 20 --follow

Each call sends the CLI's key (AGENTRUN_API_KEY, else the profile's, else the dev stack's
admin key, or its platform key for the platform's commands) and `--workspace`; `--platform`
acts on the platform's own keys (executor and platform) and audit log.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, TypeAlias

import grpc
from google.protobuf import timestamp_pb2

from agentrun.v1 import admin_pb2 as pb
from agentrun.v1 import admin_pb2_grpc
from agentrun_cli import argtypes, credentials, durations, output, render, render_admin

TIMEOUT = 30.0
ROLES = ["admin", "operator", "reader", "approver"]


Stub: TypeAlias = admin_pb2_grpc.WorkspaceAdminServiceStub


def _stub(args: argparse.Namespace, role: str = "admin") -> tuple[grpc.Channel, Stub]:
    """A channel with the CLI's key; with none configured, the dev stack's `role` key."""
    channel = credentials.channel(args.address, credentials.api_key(role))
    return channel, Stub(channel)


def _call(args: argparse.Namespace, method: str, request: Any, role: str = "admin") -> Any:
    channel, stub = _stub(args, role)
    with channel:
        return getattr(stub, method)(request, timeout=TIMEOUT)


def _emit(args: argparse.Namespace, value: Any, lines: Iterable[str]) -> None:
    output.emit(args, value, lines)


def _ws(args: argparse.Namespace) -> str:
    """The workspace acted on: none with --platform (the platform's keys and audit log)."""
    return "" if getattr(args, "platform", False) else args.workspace


# --- workspaces -------------------------------------------------------------------------------


def workspaces_create(args: argparse.Namespace) -> int:
    req = pb.CreateWorkspaceRequest(
        workspace_id=args.id, plan=args.plan, max_concurrency=args.max_concurrency
    )
    ws = _call(args, "CreateWorkspace", req, role="platform").workspace
    _emit(args, ws, [f"created workspace {ws.workspace_id}", *render_admin.workspace_lines(ws)])
    return 0


def workspaces_show(args: argparse.Namespace) -> int:
    req = pb.GetWorkspaceRequest(workspace_id=args.id or args.workspace)
    ws = _call(args, "GetWorkspace", req).workspace
    _emit(args, ws, render_admin.workspace_lines(ws))
    return 0


def workspaces_set_plan(args: argparse.Namespace) -> int:
    req = pb.SetWorkspacePlanRequest(
        workspace_id=args.id, plan=args.plan, max_concurrency=args.max_concurrency
    )
    ws = _call(args, "SetWorkspacePlan", req, role="platform").workspace
    _emit(args, ws, render_admin.workspace_lines(ws))
    return 0


def workspaces_set_retention(args: argparse.Namespace) -> int:
    req = pb.SetWorkspaceRetentionRequest(workspace_id=args.id, retention_days=args.days)
    ws = _call(args, "SetWorkspaceRetention", req).workspace
    _emit(args, ws, render_admin.workspace_lines(ws))
    return 0


def workspaces_set_approval_watch(args: argparse.Namespace) -> int:
    req = pb.SetApprovalWatchRequest(workspace_id=args.id)
    if not args.off:
        if args.approvals is None or args.window is None or args.max_decide is None:
            raise SystemExit("give APPROVALS WINDOW MAX_DECIDE (e.g. 20 1h 30s), or --off")
        req.watch.CopyFrom(
            pb.ApprovalWatch(
                approvals=args.approvals,
                window_seconds=int(args.window),
                max_decide_seconds=int(args.max_decide),
            )
        )
    ws = _call(args, "SetApprovalWatch", req).workspace
    _emit(args, ws, render_admin.workspace_lines(ws))
    return 0


def workspaces_set_allowlist(args: argparse.Namespace) -> int:
    allowlist = pb.Allowlist(name=args.name, values=args.values)
    req = pb.SetAllowlistRequest(workspace_id=args.id, allowlist=allowlist)
    ws = _call(args, "SetAllowlist", req).workspace
    _emit(args, ws, render_admin.workspace_lines(ws))
    return 0


def _wait_limit(text: str) -> str:
    """argparse `type=`: off, default, or a duration (checked here, converted by the handler)."""
    if text not in ("off", "default"):
        durations.positive_arg(text)
    return text


def workspaces_set_wait_limit(args: argparse.Namespace) -> int:
    req = pb.SetWaitLimitRequest(workspace_id=args.id, wait_kind=args.kind)
    if args.limit == "default":
        req.use_default = True
    elif args.limit != "off":
        req.max_seconds = int(durations.positive(args.limit))
    ws = _call(args, "SetWaitLimit", req).workspace
    _emit(args, ws, render_admin.workspace_lines(ws))
    return 0


# --- API keys ---------------------------------------------------------------------------------


def _key_request(args: argparse.Namespace) -> pb.CreateApiKeyRequest:
    if args.executor:
        req = pb.CreateApiKeyRequest(kind=pb.API_KEY_KIND_EXECUTOR, principal=args.name)
        req.scope.extend(s.strip() for s in (args.scope or "").split(",") if s.strip())
    elif args.platform:
        req = pb.CreateApiKeyRequest(kind=pb.API_KEY_KIND_PLATFORM, principal=args.name)
    else:
        req = pb.CreateApiKeyRequest(
            kind=pb.API_KEY_KIND_WORKSPACE,
            workspace_id=args.workspace,
            role=args.role or "",
            principal=args.name,
        )
    if args.expires_in is not None:
        expire = timestamp_pb2.Timestamp()
        expire.FromDatetime(datetime.now(UTC) + timedelta(seconds=args.expires_in))
        req.expire_time.CopyFrom(expire)
    return req


def apikeys_create(args: argparse.Namespace) -> int:
    if args.scope and not args.executor:
        raise SystemExit("error: --scope is for --executor credentials")
    if not (args.executor or args.platform or args.role):
        raise SystemExit("error: --role is required for a workspace key (or --executor/--platform)")
    role = "platform" if args.executor or args.platform else "admin"
    resp = _call(args, "CreateApiKey", _key_request(args), role=role)
    if args.json:
        print(render.to_json(resp, indent=2))
    else:
        print(resp.key_text)
    print(
        f"created key {resp.key.key_id} ({render_admin.key_what(resp.key)}, as "
        f"{resp.key.principal}): copy it now, it is not shown again",
        file=sys.stderr,
    )
    return 0


def _role(args: argparse.Namespace) -> str:
    return "platform" if getattr(args, "platform", False) else "admin"


def _keys(args: argparse.Namespace) -> Iterator[pb.ApiKey]:
    channel, stub = _stub(args, _role(args))
    with channel:
        req = pb.ListApiKeysRequest(workspace_id=_ws(args), page_size=500)
        while True:
            resp = stub.ListApiKeys(req, timeout=TIMEOUT)
            yield from resp.keys
            if not resp.next_page_token:
                return
            req.page_token = resp.next_page_token


def apikeys_list(args: argparse.Namespace) -> int:
    keys = list(_keys(args))
    _emit(args, keys, [render_admin.key_header(), *map(render_admin.key_row, keys)])
    return 0


def apikeys_revoke(args: argparse.Namespace) -> int:
    req = pb.RevokeApiKeyRequest(workspace_id=_ws(args), key_id=args.key_id)
    key = _call(args, "RevokeApiKey", req, role=_role(args)).key
    _emit(
        args,
        key,
        [f"revoked key {key.key_id} ({key.principal}); every replica refuses it within seconds"],
    )
    return 0


# --- members ----------------------------------------------------------------------------------


def members_add(args: argparse.Namespace) -> int:
    req = pb.AddMemberRequest(workspace_id=args.workspace, person=args.email, role=args.role)
    m = _call(args, "AddMember", req).member
    _emit(args, m, [f"{m.person} is {m.role} of {m.workspace_id}"])
    return 0


def members_remove(args: argparse.Namespace) -> int:
    req = pb.RemoveMemberRequest(workspace_id=args.workspace, person=args.email)
    m = _call(args, "RemoveMember", req).member
    _emit(args, m, [f"removed {m.person} from {m.workspace_id}"])
    return 0


def members_list(args: argparse.Namespace) -> int:
    channel, stub = _stub(args)
    members: list[pb.Member] = []
    with channel:
        req = pb.ListMembersRequest(workspace_id=args.workspace, page_size=500)
        while True:
            resp = stub.ListMembers(req, timeout=TIMEOUT)
            members += resp.members
            if not resp.next_page_token:
                break
            req.page_token = resp.next_page_token
    _emit(args, members, [render_admin.member_header(), *map(render_admin.member_row, members)])
    return 0


# --- audit ------------------------------------------------------------------------------------


def _newest(stub: Any, ws: str, limit: int, after: int = 0) -> list[pb.AuditEntry]:
    """Up to `limit` newest entries with audit id above `after`, oldest first."""
    req = pb.ListAuditLogRequest(workspace_id=ws, page_size=min(limit, 500))
    found: list[pb.AuditEntry] = []
    while len(found) < limit:
        resp = stub.ListAuditLog(req, timeout=TIMEOUT)
        fresh = [e for e in resp.entries if e.audit_id > after]
        found += fresh
        if len(fresh) < len(resp.entries) or not resp.next_page_token:
            break
        req.page_token = resp.next_page_token
    return list(reversed(found[:limit]))


def audit(args: argparse.Namespace) -> int:
    """The last `--limit` entries, oldest first; with --follow, new ones as they are written."""
    channel, stub = _stub(args, _role(args))
    with channel:
        entries = _newest(stub, _ws(args), args.limit)
        if args.json:
            for e in entries:
                print(render.to_json(e), flush=True)
        else:
            for line in render_admin.audit_table(entries):
                print(line, flush=True)
        last = entries[-1].audit_id if entries else 0
        while args.follow:
            time.sleep(args.interval)  # polling the server, not synchronising a test
            for e in _newest(stub, _ws(args), 500, after=last):
                print(render.to_json(e) if args.json else render_admin.audit_row(e), flush=True)
                last = e.audit_id
    return 0


# --- parser -----------------------------------------------------------------------------------


def _add_workspaces(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    actions = sub.add_parser(
        "workspaces", help="create workspaces, show them, set their plan"
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    p = actions.add_parser("create", help="a new workspace (platform admin)", parents=[common])
    p.add_argument("id", metavar="WORKSPACE")
    p.add_argument("--plan", default="team", help="free, team (default) or enterprise")
    p.add_argument(
        "--max-concurrency",
        type=argtypes.int32,
        default=0,
        metavar="N",
        help="cap on running runs (default: the plan's; enterprise needs one)",
    )
    p.set_defaults(handler=workspaces_create)
    p = actions.add_parser(
        "show", help="a workspace's plan, cap and running count", parents=[common]
    )
    p.add_argument("id", metavar="WORKSPACE", nargs="?", default="", help="default: --workspace")
    p.set_defaults(handler=workspaces_show)
    p = actions.add_parser(
        "set-plan", help="change a workspace's plan (platform admin)", parents=[common]
    )
    p.add_argument("id", metavar="WORKSPACE")
    p.add_argument("plan", metavar="PLAN")
    p.add_argument("--max-concurrency", type=argtypes.int32, default=0, metavar="N")
    p.set_defaults(handler=workspaces_set_plan)
    _add_workspace_settings(actions, common)


def _add_workspace_settings(
    actions: argparse._SubParsersAction, common: argparse.ArgumentParser
) -> None:
    """`workspaces set-…`: a workspace's own settings (retention, watches, lists, wait limits)."""
    p = actions.add_parser(
        "set-retention", help="days finished runs are kept (0: forever)", parents=[common]
    )
    p.add_argument("days", metavar="DAYS", type=argtypes.int32)
    p.add_argument("--id", default="", metavar="WORKSPACE", help="default: the key's own")
    p.set_defaults(handler=workspaces_set_retention)
    p = actions.add_parser(
        "set-approval-watch",
        help="flag an approver to the admins for approving too fast",
        parents=[common],
    )
    p.add_argument("approvals", metavar="APPROVALS", type=argtypes.int32, nargs="?")
    p.add_argument("window", metavar="WINDOW", type=durations.positive_arg, nargs="?")
    p.add_argument("max_decide", metavar="MAX_DECIDE", type=durations.positive_arg, nargs="?")
    p.add_argument("--off", action="store_true", help="no watch")
    p.add_argument("--id", default="", metavar="WORKSPACE", help="default: the key's own")
    p.set_defaults(handler=workspaces_set_approval_watch)
    p = actions.add_parser(
        "set-allowlist",
        help="a named list value_allowed rules name in workspace_list (no values: remove it)",
        parents=[common],
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument("values", metavar="VALUE", nargs="*")
    p.add_argument("--id", default="", metavar="WORKSPACE", help="default: the key's own")
    p.set_defaults(handler=workspaces_set_allowlist)
    p = actions.add_parser(
        "set-wait-limit",
        help="how long a run may wait for a kind of thing before it fails",
        parents=[common],
    )
    p.add_argument(
        "kind", choices=("approval", "human", "repeat", "connection", "signal", "child", "event")
    )
    p.add_argument(
        "limit", type=_wait_limit, metavar="AGE|off|default", help="7d; off: never; default: 30d"
    )
    p.add_argument("--id", default="", metavar="WORKSPACE", help="default: the key's own")
    p.set_defaults(handler=workspaces_set_wait_limit)


def _add_apikeys(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    actions = sub.add_parser(
        "apikeys", help="API keys and executor credentials: create, list, revoke"
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    p = actions.add_parser("create", help="mint a key (printed once)", parents=[common])
    p.add_argument(
        "--name",
        required=True,
        metavar="PRINCIPAL",
        help="the person or service it acts as (an approver: their email)",
    )
    p.add_argument("--role", choices=ROLES, help="a workspace key's role")
    p.add_argument(
        "--expires-in", type=durations.positive_arg, metavar="DURATION", help="e.g. 12h, 30d"
    )
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--executor", action="store_true", help="an executor credential")
    kind.add_argument("--platform", action="store_true", help="a platform admin key")
    p.add_argument("--scope", metavar="WS,WS", help="workspaces an executor serves (default all)")
    p.set_defaults(handler=apikeys_create)
    for action, text, handler in (
        ("list", "keys (never their secrets)", apikeys_list),
        ("revoke", "revoke a key by its id", apikeys_revoke),
    ):
        p = actions.add_parser(action, help=text, parents=[common])
        if action == "revoke":
            p.add_argument("key_id", metavar="KEY_ID")
        p.add_argument(
            "--platform", action="store_true", help="executor and platform keys, not a workspace's"
        )
        p.set_defaults(handler=handler)


def _add_members(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    actions = sub.add_parser(
        "members", help="people who sign in (OIDC) and their roles"
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    p = actions.add_parser("add", help="give a person a role", parents=[common])
    p.add_argument("email", metavar="EMAIL")
    p.add_argument("--role", required=True, choices=ROLES)
    p.set_defaults(handler=members_add)
    p = actions.add_parser("remove", help="remove a person", parents=[common])
    p.add_argument("email", metavar="EMAIL")
    p.set_defaults(handler=members_remove)
    p = actions.add_parser("list", help="the workspace's people", parents=[common])
    p.set_defaults(handler=members_list)


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    _add_workspaces(sub, common)
    _add_apikeys(sub, common)
    _add_members(sub, common)
    p = sub.add_parser("audit", help="the audit log: who did what, when", parents=[common])
    p.add_argument("--limit", type=argtypes.int32, default=50, metavar="N", help="default 50")
    p.add_argument("--follow", action="store_true", help="then print new entries until Ctrl-C")
    p.add_argument("--interval", type=durations.arg, default=2.0, help=argparse.SUPPRESS)
    p.add_argument("--platform", action="store_true", help="the platform's own log")
    p.set_defaults(handler=audit)
