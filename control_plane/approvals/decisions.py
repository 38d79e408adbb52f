"""Deciding an approval: who may, through which door, and what the run's log records.

The decider is always established by the door, never typed by the caller:

* ``signed_in`` — a person signed in with OpenID Connect (a PERSON principal);
* ``key`` — a workspace API key with the ``approver`` role, bound to a person;
* ``link`` — possession of a single-use capability link mailed to one approver;
* ``slack`` — a Slack user whose click carried a valid Slack signature.

Rules, for every door: the decider must be named on the approval's list (the
Slack list for Slack clicks; where the policy named nobody, the list is the
fallback `admin`, which a signed-in member with the admin role matches); a tool that moves money or is high-risk needs a
signed-in person (not a link, a key or a Slack click); an executor or platform
credential never decides; when the agent version asks for four eyes, the
principal who started the run cannot approve (or edit) its calls.

Every decision appends an `approval.decided` audit row in its own transaction,
naming the principal (or, for links and Slack, `link:<approver>`/`slack:<user>`).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import faults
from control_plane.approvals import watch
from control_plane.approvals.hashing import arguments_sha256, canonical_json
from control_plane.approvals.policy import FALLBACK_APPROVER
from control_plane.auth import audit
from control_plane.auth.principal import Capability, Kind, Principal
from control_plane.ground import validate
from control_plane.ground.errors import (
    Aborted,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from control_plane.store import approvals as store
from control_plane.store.db import Connection, Pool, transaction

ACTIONS = {"approve": "approved", "reject": "rejected", "edit": "edited"}
SIGNED_IN, KEY, LINK, SLACK = "signed_in", "key", "link", "slack"
EXPIRY = "expiry"  # the expiry loop: not a decider, but how an expired approval was closed
DOORS = {LINK: "an approval link", KEY: "an API key", SLACK: "a Slack button"}


@dataclass(frozen=True)
class Decider:
    """Who decides (`name`, recorded as `decided_by`) and how that was established (`via`)."""

    name: str
    via: str  # signed_in | key | link | slack
    role: str | None = None  # the principal's role in the workspace, when known
    principal: str = ""  # the authenticated principal's label, `kind:name` (none: link, Slack)

    @property
    def actor(self) -> str:
        """Who the audit log says acted: the principal, else the door and its person."""
        return self.principal or f"{self.via}:{self.name}"

    @classmethod
    def of(cls, principal: Principal) -> Decider:
        """The decider an authenticated principal is; refuses credentials that never decide."""
        if principal.kind is Kind.PERSON:
            return cls(principal.name, SIGNED_IN, principal.role, principal.label)
        if principal.kind is Kind.KEY and principal.may(Capability.DECIDE):
            return cls(principal.name, KEY, principal.role, principal.label)
        if principal.kind is Kind.KEY:
            raise PermissionDenied(
                f"a key with role {principal.role or 'none'!r} cannot decide approvals "
                "(an approver key or a signed-in person can)"
            )
        raise PermissionDenied(f"a {principal.kind.value} credential never decides approvals")


@dataclass(frozen=True)
class Request:
    """A human's decision on one approval."""

    workspace_id: str
    approval_id: uuid.UUID
    decider: Decider
    action: str  # approve | reject | edit
    reason: str = ""
    edited_arguments_json: str = ""
    note: str = ""


def needs_sign_in(row: store.Approval) -> str | None:
    """Why only a signed-in person may decide this approval, or None."""
    if row.moves_money:
        return f"tool {row.tool!r} moves money"
    if row.high_risk:
        return f"tool {row.tool!r} is high-risk"
    return None


def on_list(d: Decider, allowed: list[str]) -> bool:
    """Named on the list, or a workspace admin where the policy named nobody (the fallback)."""
    return d.name in allowed or (FALLBACK_APPROVER in allowed and d.role == FALLBACK_APPROVER)


def check_decider(req: Request, row: store.Approval, guard: store.RunGuard) -> None:
    """Refuse (PERMISSION_DENIED) a decider the approval's rules do not admit."""
    d = req.decider
    allowed = row.slack_approvers if d.via == SLACK else row.approvers
    if not on_list(d, list(allowed)):
        raise PermissionDenied(f"{d.name!r} is not an approver of approval {req.approval_id}")
    why = needs_sign_in(row)
    if why and d.via != SIGNED_IN:
        raise PermissionDenied(
            f"{why}: only a signed-in approver on its list may decide it, not {DOORS[d.via]}"
        )
    if guard.four_eyes and req.action != "reject" and d.name == guard.starter_name:
        raise PermissionDenied(
            f"four eyes: {d.name!r} started run {row.run_id} and cannot approve its calls"
        )


def _effective_arguments(req: Request, row: store.Approval) -> tuple[Any, str | None]:
    """The arguments that will run, and the edited JSON to store (edits only)."""
    original = json.loads(row.arguments)
    if req.action != "edit":
        return original, None
    edited = validate.json_value("edit.arguments_json", req.edited_arguments_json)
    if not isinstance(edited, dict):
        raise InvalidArgument("edit.arguments_json", "must be a JSON object")
    return edited, canonical_json(edited)


def decided_payload(
    row: store.Approval,
    decision: str,
    decided_by: str,
    via: str,
    arguments: Any,
    *,
    reason: str = "",
    note: str = "",
) -> dict[str, Any]:
    """The `approval_decided` step's payload: the one place it is built (decisions and expiry)."""
    payload = {
        "approval_id": str(row.approval_id),
        "call_id": row.call_id,
        "tool": row.tool,
        "decision": decision,
        "decided_by": decided_by,
        "via": via,
        "arguments": arguments,
        "arguments_sha256": arguments_sha256(arguments),
        "approved_sha256": row.arguments_sha256,
    }
    if decision in ("rejected", "expired"):
        payload["reason"] = reason or decision
    if decision == "edited":
        payload["edited_from"] = json.loads(row.arguments)
        payload["note"] = note
    return payload


async def _audit(conn: Connection, req: Request, row: store.Approval, decision: str) -> None:
    """The decision's audit row, in its transaction (never the arguments: they may be private)."""
    detail = {
        "run_id": str(row.run_id),
        "tool": row.tool,
        "decision": decision,
        "decided_by": req.decider.name,
        "via": req.decider.via,
    }
    await audit.record(
        conn,
        "approval.decided",
        "approval",
        str(req.approval_id),
        detail,
        workspace_id=req.workspace_id,
        actor=req.decider.actor,
    )


async def decide(pool: Pool, req: Request) -> store.Approval:
    """Apply a human decision exactly once; the loser learns who won."""
    if req.action not in ACTIONS:
        raise InvalidArgument("decision", "must be approve, reject or edit")
    row = await store.get(pool, req.workspace_id, req.approval_id)
    if row is None:
        raise NotFound(f"approval {req.approval_id} not found")
    check_decider(req, row, await store.run_guard(pool, req.workspace_id, row.run_id))
    arguments, edited_json = _effective_arguments(req, row)
    decision = ACTIONS[req.action]
    who = req.decider.name
    d = store.Decision(decision, who, req.reason or None, edited_json)
    payload = decided_payload(
        row, decision, who, req.decider.via, arguments, reason=req.reason, note=req.note
    )
    async with transaction(pool) as conn:
        try:
            decided = await store.decide(conn, req.workspace_id, req.approval_id, d, payload)
            await _audit(conn, req, row, decision)
            if decision == "approved":
                await watch.after_approval(conn, req.workspace_id, who, req.approval_id)
            faults.point("control_plane.approval.before_commit")
            return decided
        except store.DecisionLost as lost:
            w = lost.winner
            when = w.decided_at.isoformat() if w.decided_at else "?"
            if w.decision == store.CLOSED:  # no race lost: nobody can decide it any more
                raise FailedPrecondition(
                    f"approval {req.approval_id} was closed at {when}: {w.reason}"
                ) from None
            raise Aborted(
                f"approval {req.approval_id} was already {w.decision} by {w.decided_by} "
                f"at {w.decided_at.isoformat() if w.decided_at else '?'}"
            ) from None
        except store.RunNotWaiting as exc:
            raise FailedPrecondition(str(exc)) from None
