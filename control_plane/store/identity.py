"""Credentials, members and the audit log (sql/identity.sql), as typed rows.

A key's hash leaves this module only inside `StoredKey` (for the one
constant-time compare the resolver makes); listings never carry it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeAlias

import asyncpg

from control_plane.store.queries import run

# The audit log's workspace for platform-level writes (executor and platform
# keys, which belong to no workspace). Not a valid workspace id, so it cannot clash.
PLATFORM_AUDIT = "_platform"

Conn: TypeAlias = asyncpg.pool.Pool | asyncpg.Connection


@dataclass(frozen=True)
class StoredKey:
    """A live key as the resolver needs it (with its hash)."""

    key_id: str
    kind: str
    workspace_id: str | None
    role: str | None
    principal: str
    scope: tuple[str, ...] | None
    secret_sha256: bytes
    expires_at: datetime | None

    def __repr__(self) -> str:  # the hash stays out of logs too
        return f"StoredKey(key_id={self.key_id!r}, kind={self.kind!r})"


@dataclass(frozen=True)
class KeyInfo:
    """A key's listing: everything but its secret and hash."""

    key_id: str
    kind: str
    workspace_id: str | None
    role: str | None
    principal: str
    scope: tuple[str, ...] | None
    created_by: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


@dataclass(frozen=True)
class NewKeyRow:
    key_id: str
    kind: str
    workspace_id: str | None
    role: str | None
    principal: str
    scope: list[str] | None
    secret_sha256: bytes
    created_by: str
    expires_at: datetime | None = None


@dataclass(frozen=True)
class Member:
    workspace_id: str
    person: str
    role: str
    added_by: str
    added_at: datetime


@dataclass(frozen=True)
class AuditEntry:
    workspace_id: str
    audit_id: int
    at: datetime
    actor: str
    action: str
    object_kind: str
    object_id: str
    request_id: str
    detail: dict[str, Any]


@dataclass(frozen=True)
class AuditEvent:
    """What a privileged write appends: who, what, which object, under which request."""

    workspace_id: str
    actor: str
    action: str
    object_kind: str
    object_id: str
    request_id: str
    detail: dict[str, Any] | None = None


def _scope(value: list[str] | None) -> tuple[str, ...] | None:
    return tuple(value) if value is not None else None


def _key_info(row: asyncpg.Record) -> KeyInfo:
    fields = dict(row)
    fields["scope"] = _scope(fields["scope"])
    return KeyInfo(**fields)


async def insert_key(conn: Conn, key: NewKeyRow, now: datetime | None = None) -> KeyInfo:
    row = await run(
        conn,
        "api_key_insert",
        key.key_id,
        key.kind,
        key.workspace_id,
        key.role,
        key.principal,
        key.scope,
        key.secret_sha256,
        key.created_by,
        key.expires_at,
        now,
    )
    return _key_info(row)


async def lookup_key(conn: Conn, key_id: str, now: datetime | None = None) -> StoredKey | None:
    """The live (not revoked, not expired) key with this id, or None."""
    row = await run(conn, "api_key_lookup", key_id, now)
    if row is None:
        return None
    fields = dict(row)
    fields["scope"] = _scope(fields["scope"])
    fields["secret_sha256"] = bytes(fields["secret_sha256"])
    return StoredKey(**fields)


async def get_key(conn: Conn, key_id: str) -> KeyInfo | None:
    row = await run(conn, "api_key_get", key_id)
    return _key_info(row) if row is not None else None


async def list_keys(
    conn: Conn, workspace_id: str | None, after: str | None, limit: int
) -> list[KeyInfo]:
    """Keys of a workspace (None: the platform's executor and platform keys), by id."""
    return [_key_info(r) for r in await run(conn, "api_key_list", workspace_id, after, limit)]


async def revoke_key(
    conn: Conn, key_id: str, workspace_id: str | None, now: datetime | None = None
) -> KeyInfo | None:
    """The revoked key, or None when the workspace has no such live key."""
    row = await run(conn, "api_key_revoke", key_id, workspace_id, now)
    return _key_info(row) if row is not None else None


def email(person: str) -> str:
    """How members are stored and compared: the verified email, lower-cased (as sign-in
    names a person: control_plane/auth/oidc.py)."""
    return person.strip().lower()


async def add_member(
    conn: Conn, workspace_id: str, person: str, role: str, added_by: str
) -> Member:
    row = await run(conn, "member_upsert", workspace_id, email(person), role, added_by)
    return Member(**dict(row))


async def remove_member(conn: Conn, workspace_id: str, person: str) -> Member | None:
    row = await run(conn, "member_delete", workspace_id, email(person))
    return Member(**dict(row)) if row is not None else None


async def list_members(
    conn: Conn, workspace_id: str, after: str | None, limit: int
) -> list[Member]:
    return [Member(**dict(r)) for r in await run(conn, "member_list", workspace_id, after, limit)]


async def member_role(conn: Conn, workspace_id: str, person: str) -> str | None:
    row = await run(conn, "member_role", workspace_id, email(person))
    return row["role"] if row is not None else None


def _entry(row: asyncpg.Record) -> AuditEntry:
    fields = dict(row)
    fields["detail"] = json.loads(fields["detail"])
    return AuditEntry(**fields)


async def audit(
    conn: asyncpg.Connection, event: AuditEvent, now: datetime | None = None
) -> AuditEntry:
    """Append an audit row. Pass the connection of the write's own transaction."""
    row = await run(
        conn,
        "audit_append",
        event.workspace_id,
        event.actor,
        event.action,
        event.object_kind,
        event.object_id,
        event.request_id,
        json.dumps(event.detail or {}),
        now,
    )
    return _entry(row)


async def list_audit(
    conn: Conn, workspace_id: str, before: int | None, limit: int
) -> list[AuditEntry]:
    """A page of the audit log, newest first, before audit id `before`."""
    return [_entry(r) for r in await run(conn, "audit_list", workspace_id, before, limit)]


class PlanNeedsCap(ValueError):
    """The plan has no cap of its own (enterprise) and none was given."""


async def create_workspace(
    conn: Conn, workspace_id: str, plan: str, max_concurrency: int | None
) -> asyncpg.Record | None:
    """The new workspace, or None when it exists already or the plan does not."""
    try:
        return await run(conn, "workspace_create", workspace_id, plan, max_concurrency)
    except asyncpg.NotNullViolationError:
        raise PlanNeedsCap(f"plan {plan!r} has no default cap: give max_concurrency") from None
