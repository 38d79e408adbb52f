"""WorkspaceAdminService: workspaces, plans, keys, members and the audit log.

The interceptor has checked the coarse capability (access.py); this module
decides the rest: a workspace admin acts only in its own workspace and mints
only workspace keys; a platform admin names the workspace it acts on.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import grpc

from agentrun.v1 import admin_pb2 as pb
from agentrun.v1 import admin_pb2_grpc
from control_plane.approvals import watch
from control_plane.auth import audit, credentials
from control_plane.auth import context as auth_context
from control_plane.auth.principal import ROLES, Kind
from control_plane.deploys.canary import CANARY_WORKSPACE
from control_plane.ground import constraints, convert, validate
from control_plane.ground.errors import AlreadyExists, InvalidArgument, NotFound, PermissionDenied
from control_plane.runs import wait_limits
from control_plane.store import identity as store
from control_plane.store import retention, workspaces
from control_plane.store.db import Pool, transaction

T = TypeVar("T")
C = TypeVar("C")

KINDS = {
    pb.API_KEY_KIND_UNSPECIFIED: "workspace",
    pb.API_KEY_KIND_WORKSPACE: "workspace",
    pb.API_KEY_KIND_EXECUTOR: "executor",
    pb.API_KEY_KIND_PLATFORM: "platform",
}
KINDS_TO_PROTO = {
    "workspace": pb.API_KEY_KIND_WORKSPACE,
    "executor": pb.API_KEY_KIND_EXECUTOR,
    "platform": pb.API_KEY_KIND_PLATFORM,
}


def workspace_message(row: Any) -> pb.Workspace:
    return pb.Workspace(
        workspace_id=row["workspace_id"],
        plan=row["plan"],
        max_concurrency=row["max_concurrency"],
        running=row["running"],
        retention_days=row.get("retention_days", 0),
        approval_watch=watch.from_json(row.get("approval_watch")),
        allowlists=allowlist_messages(row.get("allowlists")),
        wait_limit_seconds=wait_limits.effective(row.get("wait_limits")),
    )


def allowlist_messages(data: Any) -> list[pb.Allowlist]:
    """A workspace's stored allowlists ({name: [values]}), by name."""
    lists = json.loads(data) if isinstance(data, str) else data or {}
    return [pb.Allowlist(name=k, values=lists[k]) for k in sorted(lists)]


def key_message(k: store.KeyInfo) -> pb.ApiKey:
    return pb.ApiKey(
        key_id=k.key_id,
        kind=KINDS_TO_PROTO[k.kind],
        workspace_id=k.workspace_id or "",
        role=k.role or "",
        principal=k.principal,
        scope=list(k.scope or ()),
        all_workspaces=k.kind == "executor" and k.scope is None,
        created_by=k.created_by,
        create_time=convert.timestamp(k.created_at),
        expire_time=convert.timestamp(k.expires_at),
        revoke_time=convert.timestamp(k.revoked_at),
    )


def member_message(m: store.Member) -> pb.Member:
    return pb.Member(
        workspace_id=m.workspace_id,
        person=m.person,
        role=m.role,
        added_by=m.added_by,
        add_time=convert.timestamp(m.added_at),
    )


def audit_message(e: store.AuditEntry) -> pb.AuditEntry:
    return pb.AuditEntry(
        workspace_id=e.workspace_id,
        audit_id=e.audit_id,
        time=convert.timestamp(e.at),
        actor=e.actor,
        action=e.action,
        object_kind=e.object_kind,
        object_id=e.object_id,
        request_id=e.request_id,
        detail_json=json.dumps(e.detail),
    )


def target_workspace(requested: str, *, platform_default: str | None = None) -> str | None:
    """The workspace acted on: a workspace admin's own; the one a platform admin names."""
    who = auth_context.current()
    if who.kind is not Kind.PLATFORM:
        return auth_context.workspace(requested)
    if not requested:
        return platform_default
    return validate.slug("workspace_id", requested)


def role(field: str, value: str) -> str:
    if value not in ROLES:
        raise InvalidArgument(field, f"must be one of {', '.join(sorted(ROLES))}")
    return value


def person(value: str) -> str:
    validate.text("person", value, max_bytes=320, required=True)
    if "@" not in value or len(value) < 3:
        raise InvalidArgument("person", "must be a verified email address")
    return value.lower()


def page_size(value: int) -> int:
    return validate.in_range("page_size", value or 100, 1, 500)


def text_token(max_bytes: int) -> Callable[[str], str | None]:
    """A page token that is the last row's text key (a key id, a person)."""
    return lambda raw: validate.text("page_token", raw, max_bytes=max_bytes) or None


def audit_token(raw: str) -> int | None:
    """A page token that is an audit id: ASCII digits that fit a bigint ("²" is a digit to
    isdigit, and a 40-digit number overflowed the query into an INTERNAL)."""
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 18):
        raise InvalidArgument("page_token", "is not a token this service issued")
    return int(raw)


async def keyset_page(
    request: Any,
    token: Callable[[str], C],
    fetch: Callable[[C, int], Awaitable[list[T]]],
    cursor: Callable[[T], object],
) -> tuple[list[T], str]:
    """One page of `fetch(after, limit)` and the next page's token ("" on the last page):
    a row more than the page is fetched to tell whether another page follows."""
    size = page_size(request.page_size)
    rows = await fetch(token(request.page_token), size + 1)
    return rows[:size], (str(cursor(rows[size - 1])) if len(rows) > size else "")


class AdminServicer(admin_pb2_grpc.WorkspaceAdminServiceServicer):
    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def CreateWorkspace(
        self, request: pb.CreateWorkspaceRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateWorkspaceResponse:
        ws = validate.slug("workspace_id", request.workspace_id)
        if ws == CANARY_WORKSPACE:
            raise InvalidArgument("workspace_id", "is reserved for the contract canary")
        plan = request.plan or "team"
        cap = validate.in_range("max_concurrency", request.max_concurrency, 0, 1_000_000) or None
        async with transaction(self._pool) as conn:
            try:
                row = await store.create_workspace(conn, ws, plan, cap)
            except store.PlanNeedsCap:
                raise InvalidArgument("max_concurrency", f"plan {plan!r} needs one") from None
            if row is None:
                if await workspaces.get(conn, ws) is not None:
                    raise AlreadyExists(f"workspace {ws!r} already exists")
                raise InvalidArgument("plan", f"no plan {plan!r}")
            await audit.record(
                conn, "workspace.created", "workspace", ws, {"plan": plan}, workspace_id=ws
            )
        return pb.CreateWorkspaceResponse(workspace=workspace_message(row))

    async def GetWorkspace(
        self, request: pb.GetWorkspaceRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetWorkspaceResponse:
        ws = target_workspace(request.workspace_id)
        if ws is None:
            raise InvalidArgument("workspace_id", "is required")
        row = await workspaces.get(self._pool, ws)
        if row is None:
            raise NotFound(f"workspace {ws!r} not found")
        return pb.GetWorkspaceResponse(workspace=workspace_message(row))

    async def SetWorkspacePlan(
        self, request: pb.SetWorkspacePlanRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetWorkspacePlanResponse:
        ws = validate.slug("workspace_id", request.workspace_id)
        plan = validate.slug("plan", request.plan)
        cap = validate.in_range("max_concurrency", request.max_concurrency, 0, 1_000_000) or None
        async with transaction(self._pool) as conn:
            if await workspaces.get(conn, ws) is None:
                raise NotFound(f"workspace {ws!r} not found")
            try:
                row = await workspaces.set_plan(conn, ws, plan, cap)
            except workspaces.UnknownPlan as exc:
                raise InvalidArgument("plan", str(exc)) from None
            await audit.record(
                conn,
                "workspace.plan_changed",
                "workspace",
                ws,
                {"plan": plan, "max_concurrency": row["max_concurrency"]},
                workspace_id=ws,
            )
        return pb.SetWorkspacePlanResponse(workspace=workspace_message(row))

    async def SetWorkspaceRetention(
        self, request: pb.SetWorkspaceRetentionRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetWorkspaceRetentionResponse:
        ws = target_workspace(request.workspace_id)
        if ws is None:
            raise InvalidArgument("workspace_id", "is required")
        days = validate.in_range("retention_days", request.retention_days, 0, 36500)
        async with transaction(self._pool) as conn:
            row = await retention.set_days(conn, ws, days)
            if row is None:
                raise NotFound(f"workspace {ws!r} not found")
            await audit.record(
                conn,
                "workspace.retention_changed",
                "workspace",
                ws,
                {"retention_days": days},
                workspace_id=ws,
            )
        return pb.SetWorkspaceRetentionResponse(workspace=workspace_message(row))

    async def SetApprovalWatch(
        self, request: pb.SetApprovalWatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetApprovalWatchResponse:
        ws = target_workspace(request.workspace_id)
        if ws is None:
            raise InvalidArgument("workspace_id", "is required")
        stored = watch.to_json(request.watch if request.HasField("watch") else None)
        async with transaction(self._pool) as conn:
            row = await workspaces.set_approval_watch(conn, ws, stored)
            if row is None:
                raise NotFound(f"workspace {ws!r} not found")
            detail = {"approval_watch": json.loads(stored) if stored else None}
            await audit.record(
                conn, "workspace.approval_watch_changed", "workspace", ws, detail, workspace_id=ws
            )
        return pb.SetApprovalWatchResponse(workspace=workspace_message(row))

    async def SetAllowlist(
        self, request: pb.SetAllowlistRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetAllowlistResponse:
        ws = target_workspace(request.workspace_id)
        if ws is None:
            raise InvalidArgument("workspace_id", "is required")
        name, values = request.allowlist.name, list(request.allowlist.values)
        constraints.validate_allowlist("allowlist", name, values)
        stored = json.dumps([v.strip() for v in values]) if values else None
        async with transaction(self._pool) as conn:
            row = await workspaces.set_allowlist(conn, ws, name, stored)
            if row is None:
                raise NotFound(f"workspace {ws!r} not found")
            detail = {"allowlist": name, "values": len(values)}
            await audit.record(
                conn, "workspace.allowlist_changed", "workspace", ws, detail, workspace_id=ws
            )
        return pb.SetAllowlistResponse(workspace=workspace_message(row))

    async def SetWaitLimit(
        self, request: pb.SetWaitLimitRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetWaitLimitResponse:
        ws = target_workspace(request.workspace_id)
        if ws is None:
            raise InvalidArgument("workspace_id", "is required")
        if request.wait_kind not in wait_limits.KINDS:
            raise InvalidArgument("wait_kind", f"must be one of {', '.join(wait_limits.KINDS)}")
        seconds: int | None = None
        if not request.use_default:
            seconds = request.max_seconds
            if seconds != 0:
                validate.in_range(
                    "max_seconds", seconds, wait_limits.MIN_SECONDS, wait_limits.MAX_SECONDS
                )
        async with transaction(self._pool) as conn:
            row = await workspaces.set_wait_limit(conn, ws, request.wait_kind, seconds)
            if row is None:
                raise NotFound(f"workspace {ws!r} not found")
            detail = {"wait_kind": request.wait_kind, "max_seconds": seconds}
            await audit.record(
                conn, "workspace.wait_limit_changed", "workspace", ws, detail, workspace_id=ws
            )
        return pb.SetWaitLimitResponse(workspace=workspace_message(row))

    async def CreateApiKey(
        self, request: pb.CreateApiKeyRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateApiKeyResponse:
        req = self._key_request(request)
        async with transaction(self._pool) as conn:
            if req.workspace_id and await workspaces.get(conn, req.workspace_id) is None:
                raise NotFound(f"workspace {req.workspace_id!r} not found")
            try:
                issued = await credentials.issue(conn, req)
            except credentials.BadKeyRequest as exc:
                raise InvalidArgument(exc.field, str(exc).split(": ", 1)[1]) from None
            info = issued.info
            detail = {
                "kind": info.kind,
                "role": info.role,
                "principal": info.principal,
                "scope": list(info.scope) if info.scope is not None else None,
            }
            await audit.record(
                conn, "key.created", "api_key", info.key_id, detail, workspace_id=info.workspace_id
            )
        return pb.CreateApiKeyResponse(key=key_message(info), key_text=issued.text)

    def _key_request(self, request: pb.CreateApiKeyRequest) -> credentials.KeyRequest:
        who = auth_context.current()
        kind = KINDS.get(request.kind)
        if kind is None:
            raise InvalidArgument("kind", "is not a key kind")
        if kind != "workspace" and who.kind is not Kind.PLATFORM:
            raise PermissionDenied(f"only a platform admin mints {kind} keys")
        ws = target_workspace(request.workspace_id) if kind == "workspace" else None
        if kind == "workspace" and ws is None:
            raise InvalidArgument("workspace_id", "is required for a workspace key")
        principal = validate.text("principal", request.principal, max_bytes=200, required=True)
        expires = None
        if request.HasField("expire_time"):
            expires = request.expire_time.ToDatetime(tzinfo=UTC)
            if expires <= datetime.now(UTC):
                raise InvalidArgument("expire_time", "is in the past")
        scope = None
        if kind == "executor" and request.scope:
            scope = [validate.slug(f"scope[{i}]", s) for i, s in enumerate(request.scope)]
        elif request.scope:
            raise InvalidArgument("scope", "only executor keys have a scope")
        return credentials.KeyRequest(
            kind=kind,
            principal=principal,
            created_by=who.label,
            workspace_id=ws,
            role=role("role", request.role) if kind == "workspace" else None,
            scope=scope,
            expires_at=expires,
        )

    async def ListApiKeys(
        self, request: pb.ListApiKeysRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListApiKeysResponse:
        ws = target_workspace(request.workspace_id)
        keys, token = await keyset_page(
            request,
            text_token(64),
            lambda after, n: store.list_keys(self._pool, ws, after, n),
            lambda k: k.key_id,
        )
        return pb.ListApiKeysResponse(keys=[key_message(k) for k in keys], next_page_token=token)

    async def RevokeApiKey(
        self, request: pb.RevokeApiKeyRequest, context: grpc.aio.ServicerContext
    ) -> pb.RevokeApiKeyResponse:
        ws = target_workspace(request.workspace_id)
        key_id = validate.text("key_id", request.key_id, max_bytes=64, required=True)
        async with transaction(self._pool) as conn:
            info = await store.revoke_key(conn, key_id, ws)
            if info is None:
                raise NotFound(f"no live key {key_id!r} here")
            await audit.record(
                conn,
                "key.revoked",
                "api_key",
                key_id,
                {"principal": info.principal},
                workspace_id=ws,
            )
        return pb.RevokeApiKeyResponse(key=key_message(info))

    async def AddMember(
        self, request: pb.AddMemberRequest, context: grpc.aio.ServicerContext
    ) -> pb.AddMemberResponse:
        ws = auth_context.workspace(request.workspace_id)
        who, what = person(request.person), role("role", request.role)
        async with transaction(self._pool) as conn:
            member = await store.add_member(conn, ws, who, what, auth_context.current().label)
            await audit.record(conn, "member.added", "member", who, {"role": what})
        return pb.AddMemberResponse(member=member_message(member))

    async def RemoveMember(
        self, request: pb.RemoveMemberRequest, context: grpc.aio.ServicerContext
    ) -> pb.RemoveMemberResponse:
        ws = auth_context.workspace(request.workspace_id)
        who = person(request.person)
        async with transaction(self._pool) as conn:
            member = await store.remove_member(conn, ws, who)
            if member is None:
                raise NotFound(f"{who} is not a member")
            await audit.record(conn, "member.removed", "member", who)
        return pb.RemoveMemberResponse(member=member_message(member))

    async def ListMembers(
        self, request: pb.ListMembersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListMembersResponse:
        ws = auth_context.workspace(request.workspace_id)
        members, token = await keyset_page(
            request,
            text_token(320),
            lambda after, n: store.list_members(self._pool, ws, after, n),
            lambda m: m.person,
        )
        return pb.ListMembersResponse(
            members=[member_message(m) for m in members], next_page_token=token
        )

    async def ListAuditLog(
        self, request: pb.ListAuditLogRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListAuditLogResponse:
        ws = target_workspace(request.workspace_id, platform_default=store.PLATFORM_AUDIT)
        assert ws is not None
        entries, token = await keyset_page(
            request,
            audit_token,
            lambda before, n: store.list_audit(self._pool, ws, before, n),
            lambda e: e.audit_id,
        )
        return pb.ListAuditLogResponse(
            entries=[audit_message(e) for e in entries], next_page_token=token
        )
