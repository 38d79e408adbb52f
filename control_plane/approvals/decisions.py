"""Deciding an approval: who may, through which door, and what the run's log records."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import faults
from control_plane.api import validate
from control_plane.approvals.hashing import arguments_sha256, canonical_json
from control_plane.errors import (
    Aborted,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from control_plane.store import approvals as store
from control_plane.store.db import Pool, Record, transaction

ACTIONS = {"approve": "approved", "reject": "rejected", "edit": "edited"}


@dataclass(frozen=True)
class Request:
    """A human's decision, and how their identity was established."""

    workspace_id: str
    approval_id: uuid.UUID
    approver: str
    action: str  # approve | reject | edit
    # link: possession of a capability link; slack: a verified Slack user;
    # signed_in: a verified bearer token; operator: the gRPC API.
    via: str
    reason: str = ""
    edited_arguments_json: str = ""
    note: str = ""


def _check_who(req: Request, row: Any) -> None:
    allowed = row["slack_approvers"] if req.via == "slack" else row["approvers"]
    if req.approver not in allowed:
        raise PermissionDenied(f"{req.approver!r} is not an approver of approval {req.approval_id}")
    if row["high_risk"] and req.via == "link":
        raise PermissionDenied(
            f"tool {row['tool']!r} is high-risk: sign in to decide (a link is not enough)"
        )


def _effective_arguments(req: Request, row: Any) -> tuple[Any, str | None]:
    """The arguments that will run, and the edited JSON to store (edits only)."""
    original = json.loads(row["arguments"])
    if req.action != "edit":
        return original, None
    edited = validate.json_value("edit.arguments_json", req.edited_arguments_json)
    if not isinstance(edited, dict):
        raise InvalidArgument("edit.arguments_json", "must be a JSON object")
    return edited, canonical_json(edited)


def step_payload(req: Request, row: Any, arguments: Any, decision: str) -> dict[str, Any]:
    payload = {
        "approval_id": str(row["approval_id"]), "call_id": row["call_id"], "tool": row["tool"],
        "decision": decision, "decided_by": req.approver, "via": req.via,
        "arguments": arguments, "arguments_sha256": arguments_sha256(arguments),
        "approved_sha256": row["arguments_sha256"],
    }  # fmt: skip
    if decision == "rejected":
        payload["reason"] = req.reason or "rejected"
    if decision == "edited":
        payload["edited_from"] = json.loads(row["arguments"])
        payload["note"] = req.note
    return payload


async def decide(pool: Pool, req: Request) -> Record:
    """Apply a human decision exactly once; the loser learns who won."""
    if req.action not in ACTIONS:
        raise InvalidArgument("decision", "must be approve, reject or edit")
    row = await store.get(pool, req.workspace_id, req.approval_id)
    if row is None:
        raise NotFound(f"approval {req.approval_id} not found")
    _check_who(req, row)
    arguments, edited_json = _effective_arguments(req, row)
    decision = ACTIONS[req.action]
    d = store.Decision(decision, req.approver, req.reason or None, edited_json)
    async with transaction(pool) as conn:
        try:
            decided = await store.decide(
                conn, req.workspace_id, req.approval_id, d,
                step_payload(req, row, arguments, decision),
            )  # fmt: skip
            faults.point("control_plane.approval.before_commit")
            return decided
        except store.DecisionLost as lost:
            w = lost.winner
            raise Aborted(
                f"approval {req.approval_id} was already {w['decision']} by {w['decided_by']} "
                f"at {w['decided_at'].isoformat()}"
            ) from None
        except store.RunNotWaiting as exc:
            raise FailedPrecondition(str(exc)) from None
