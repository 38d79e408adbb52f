"""Principals: the authenticated caller of a request, and what its role allows."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    KEY = "key"  # a workspace API key (a person or a service)
    PERSON = "person"  # a person signed in with OpenID Connect
    EXECUTOR = "executor"  # an executor pool's credential (key or client certificate)
    PLATFORM = "platform"  # a platform admin: creates workspaces


class Capability(StrEnum):
    READ = "read"  # runs, steps, agents, triggers, approvals, sessions
    OPERATE = "operate"  # start and cancel runs, resolve unknown outcomes, session turns
    ADMIN = "admin"  # agents, triggers and their secrets, keys, plan, audit
    DECIDE = "decide"  # decide approvals (the person must also be on the approval's list)


ROLES: dict[str, frozenset[Capability]] = {
    "reader": frozenset({Capability.READ}),
    "operator": frozenset({Capability.READ, Capability.OPERATE}),
    "admin": frozenset({Capability.READ, Capability.OPERATE, Capability.ADMIN}),
    "approver": frozenset({Capability.READ, Capability.DECIDE}),
}
# A signed-in workspace admin also decides: where a policy names no approver, its list is
# the workspace's admins (control_plane/approvals/policy.py). An admin key never decides.
SIGNED_IN_ROLES: dict[str, frozenset[Capability]] = {
    **ROLES,
    "admin": ROLES["admin"] | {Capability.DECIDE},
}


@dataclass(frozen=True)
class Principal:
    """Who is calling. `name` is what the log records (`decided_by`, `started_by`, audit)."""

    kind: Kind
    name: str
    # The workspace a key or a person acts in (None for executors and platform admins).
    workspace_id: str | None = None
    role: str | None = None
    # Executors: the workspaces the pool may serve; None means all of them.
    scope: frozenset[str] | None = None
    # The credential's id (never its secret), for the audit log and revocation.
    credential_id: str = ""

    @property
    def capabilities(self) -> frozenset[Capability]:
        if self.kind is Kind.PERSON and self.role:
            return SIGNED_IN_ROLES.get(self.role, frozenset())
        if self.kind is Kind.KEY and self.role:
            return ROLES.get(self.role, frozenset())
        return frozenset()

    def may(self, capability: Capability) -> bool:
        return capability in self.capabilities

    @property
    def is_person(self) -> bool:
        """A verified person (signed in), as money-moving approvals require."""
        return self.kind is Kind.PERSON

    def serves(self, workspace_id: str) -> bool:
        """Whether an executor credential may be handed this workspace's runs."""
        return self.kind is Kind.EXECUTOR and (self.scope is None or workspace_id in self.scope)

    @property
    def label(self) -> str:
        """`kind:name`, as the audit log and `decided_by` show it."""
        return f"{self.kind.value}:{self.name}"
