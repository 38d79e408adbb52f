"""The principal of the request being served, set by the interceptor or HTTP guard."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

from control_plane.auth.principal import Principal
from control_plane.ground.errors import InvalidArgument, PermissionDenied, Unauthenticated

_CURRENT: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "agentrun_principal", default=None
)


def current() -> Principal:
    """The authenticated caller; raises UNAUTHENTICATED outside an authenticated request."""
    who = _CURRENT.get()
    if who is None:
        raise Unauthenticated("a credential is required")
    return who


def current_or_none() -> Principal | None:
    """The authenticated caller, or None when no request is being served (the platform's
    own work: schedules, canaries, recovery)."""
    return _CURRENT.get()


def label_or_none() -> str | None:
    """The caller's label (`kind:name`) when a request is being served, else None."""
    who = _CURRENT.get()
    return who.label if who is not None else None


@contextmanager
def acting_as(principal: Principal) -> Iterator[Principal]:
    """Serve the enclosed code as `principal` (the interceptor and HTTP guard use this)."""
    token = _CURRENT.set(principal)
    try:
        yield principal
    finally:
        _CURRENT.reset(token)


def workspace(requested: str, field: str = "workspace_id") -> str:
    """The request's workspace: the credential's. A typed `workspace_id` must match or be empty."""
    who = current()
    if who.workspace_id is None:
        raise PermissionDenied(f"a {who.kind.value} credential does not act in a workspace")
    if requested and requested != who.workspace_id:
        if len(requested.encode()) > 63:
            raise InvalidArgument(field, "is not a workspace id")
        raise PermissionDenied(f"{field}: this credential is for another workspace")
    return who.workspace_id
