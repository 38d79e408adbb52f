"""Workspaces, API keys, members and audit entries (proto messages) as readable lines; pure."""

from __future__ import annotations

import json
from collections.abc import Iterable

from agentrun.v1 import admin_pb2 as pb
from agentrun_cli.render import short, timestamp


def workspace_lines(ws: pb.Workspace) -> list[str]:
    return [
        f"workspace  {ws.workspace_id}",
        f"plan       {ws.plan}",
        f"cap        {ws.max_concurrency} concurrent runs",
        f"running    {ws.running}",
        f"retention  {f'{ws.retention_days} days' if ws.retention_days else 'forever'}",
        *(
            [
                f"watch      {w.approvals} approvals in {w.window_seconds}s, each within "
                f"{w.max_decide_seconds}s: approver flagged"
            ]
            if (w := ws.approval_watch).approvals
            else []
        ),
        *(f"allowlist  {a.name}: {short(list(a.values), 60)}" for a in ws.allowlists),
        *(
            [
                "waits      "
                + ", ".join(
                    f"{kind} {durations_text(s)}"
                    for kind, s in sorted(ws.wait_limit_seconds.items())
                )
            ]
            if ws.wait_limit_seconds
            else []
        ),
    ]


def durations_text(seconds: int) -> str:
    """A wait limit as a reader says it: off, 30d, 12h, 90s."""
    if seconds == 0:
        return "off"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def key_kind(kind: int) -> str:
    return pb.ApiKeyKind.Name(kind).removeprefix("API_KEY_KIND_").lower()


def key_what(k: pb.ApiKey) -> str:
    """What the key may do: a workspace role, an executor scope, or the platform."""
    if k.kind == pb.API_KEY_KIND_EXECUTOR:
        return "executor of " + ("all workspaces" if k.all_workspaces else ", ".join(k.scope))
    if k.kind == pb.API_KEY_KIND_PLATFORM:
        return "platform admin"
    return f"{k.role} of {k.workspace_id}"


def key_state(k: pb.ApiKey) -> str:
    if k.HasField("revoke_time"):
        return f"revoked {timestamp(k.revoke_time)}"
    if k.HasField("expire_time"):
        return f"expires {timestamp(k.expire_time)}"
    return "live"


def key_header() -> str:
    return f"{'key id':<16}  {'principal':<24} {'may':<28} {'created':<20}  state"


def key_row(k: pb.ApiKey) -> str:
    """One line of `apikeys list`: the key's id (never its secret), who, what, when."""
    return (
        f"{k.key_id:<16}  {k.principal:<24} {key_what(k):<28} "
        f"{timestamp(k.create_time):<20}  {key_state(k)}"
    )


def member_header() -> str:
    return f"{'person':<32} {'role':<9} {'added by':<28} added"


def member_row(m: pb.Member) -> str:
    return f"{m.person:<32} {m.role:<9} {m.added_by:<28} {timestamp(m.add_time)}"


def audit_header() -> str:
    return f"{'when':<20}  {'who':<30} {'what':<24} {'object':<36} request id"


def audit_row(e: pb.AuditEntry) -> str:
    """One line of `agentrun audit`: when, who, what, which object, request id, detail."""
    obj = f"{e.object_kind}:{e.object_id}" if e.object_id else e.object_kind or "-"
    line = f"{timestamp(e.time):<20}  {e.actor:<30} {e.action:<24} {obj:<36} {e.request_id or '-'}"
    detail = _detail(e.detail_json)
    return line + (f"  {detail}" if detail else "")


def _detail(text: str) -> str:
    try:
        value = json.loads(text or "null")
    except ValueError:
        return short(text, 60)
    if not value:
        return ""
    return short(value, 60)


def audit_table(entries: Iterable[pb.AuditEntry]) -> list[str]:
    return [audit_header()] + [audit_row(e) for e in entries]
