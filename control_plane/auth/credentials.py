"""Issuing keys: generate, store the hash, hand back the text once.

The admin service, the bootstrap and the test harness all mint keys here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from control_plane.auth import keys
from control_plane.auth.principal import ROLES
from control_plane.store import identity as store


class BadKeyRequest(ValueError):
    """The key asked for breaks a rule (its `field` says which)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


@dataclass(frozen=True)
class KeyRequest:
    kind: str  # workspace, executor or platform
    principal: str
    created_by: str
    workspace_id: str | None = None
    role: str | None = None
    scope: Sequence[str] | None = None
    expires_at: datetime | None = None

    def check(self) -> None:
        if self.kind == "workspace":
            if not self.workspace_id:
                raise BadKeyRequest("workspace_id", "a workspace key needs its workspace")
            if self.role not in ROLES:
                raise BadKeyRequest("role", f"must be one of {', '.join(sorted(ROLES))}")
            if self.scope is not None:
                raise BadKeyRequest("scope", "only executor credentials have a scope")
        elif self.kind in ("executor", "platform"):
            if self.role or self.workspace_id:
                raise BadKeyRequest("role", f"a {self.kind} key has no workspace or role")
            if self.kind == "platform" and self.scope is not None:
                raise BadKeyRequest("scope", "only executor credentials have a scope")
        else:
            raise BadKeyRequest("kind", "must be workspace, executor or platform")
        if not self.principal or len(self.principal) > 200:
            raise BadKeyRequest("principal", "must be 1-200 characters")


@dataclass(frozen=True)
class Issued:
    text: str  # shown once; never stored, logged or returned again
    info: store.KeyInfo

    def __repr__(self) -> str:
        return f"Issued(key_id={self.info.key_id!r})"


async def issue(conn: store.Conn, req: KeyRequest) -> Issued:
    """Store a new key (its hash only) and return its text, once."""
    req.check()
    new = keys.generate(req.kind)
    row = store.NewKeyRow(
        key_id=new.key_id,
        kind=req.kind,
        workspace_id=req.workspace_id,
        role=req.role,
        principal=req.principal,
        scope=list(req.scope) if req.scope is not None else None,
        secret_sha256=new.digest,
        created_by=req.created_by,
        expires_at=req.expires_at,
    )
    return Issued(new.text, await store.insert_key(conn, row))
