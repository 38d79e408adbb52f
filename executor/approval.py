"""Approval holds on the executor's side: which calls need a human, and checking the verdict.

A call that needs approval is never started before a decision: the executor
commits an `approval_requested` step together with an `ApprovalRequest` (the
exact arguments and their SHA-256) and a park, and lets the run go. When the
decision wakes the run, the executor recomputes the hash of the arguments it
is about to send and refuses to send anything that is not what the human saw
and approved (or what the human wrote, for an edit).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentrun.v1 import agent_pb2, approval_pb2, executor_pb2, run_pb2
from executor.models.base import ToolCall
from executor.tools.catalogue import Tool


def canonical_json(arguments: Any) -> str:
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def arguments_sha256(arguments: Any) -> str:
    return hashlib.sha256(canonical_json(arguments).encode()).hexdigest()


def needs_approval(tool: Tool, spec: agent_pb2.AgentSpec) -> bool:
    """Money-moving and irreversible tools always; plus whatever the agent's policy names."""
    return tool.moves_money or tool.needs_approval or tool.name in spec.approval.tools


@dataclass(frozen=True)
class Hold:
    """What to commit to hold a call: the step, the request and the park."""

    step: executor_pb2.NewStep
    request: executor_pb2.ApprovalRequest
    park: executor_pb2.Park


def hold(
    seq: int,
    decision_seq: int,
    call: ToolCall,
    tool: Tool,
    spec: agent_pb2.AgentSpec,
    reason: str | None = None,
    origins: list[dict[str, Any]] | None = None,
) -> Hold:
    """`reason`: why a rule (not the tool or the policy) asks for approval, for the step;
    `origins`: where untrusted argument values first appeared (provenance.Origin.as_dict)."""
    arguments = dict(call.arguments or {})
    digest = arguments_sha256(arguments)
    approval_id = str(uuid.uuid4())
    payload: dict[str, Any] = {
        "approval_id": approval_id,
        "call_id": call.id,
        "tool": call.name,
        "arguments": arguments,
        "arguments_sha256": digest,
    }
    if reason:
        payload["reason"] = reason
    if origins:
        payload["origins"] = origins
    step = executor_pb2.NewStep(
        seq=seq,
        kind=run_pb2.STEP_KIND_APPROVAL_REQUESTED,
        ref_seq=decision_seq,
        payload_json=json.dumps(payload),
    )
    request = executor_pb2.ApprovalRequest(
        approval_id=approval_id,
        decision_seq=decision_seq,
        call_id=call.id,
        tool=call.name,
        arguments_json=canonical_json(arguments),
        arguments_sha256=digest,
        moves_money=tool.moves_money,
        high_risk=tool.name in spec.approval.high_risk_tools,
        argument_origins=[approval_pb2.ArgumentOrigin(**o) for o in origins or []],
    )
    return Hold(step, request, executor_pb2.Park(wait_reason="approval"))


@dataclass(frozen=True)
class Verdict:
    """A decision, checked: the arguments to send, or why nothing is sent."""

    arguments: Mapping[str, Any] | None
    refusal: str | None = None  # rejected or tampered: the tool result's text
    edited_from: Mapping[str, Any] | None = None
    tampered: bool = False


def check(requested: Mapping[str, Any], decided: Mapping[str, Any]) -> Verdict:
    """What you approve is what runs: verify the decision's hashes before anything is sent."""
    decision = decided.get("decision")
    if decision in ("rejected", "expired"):
        return Verdict(None, f"rejected: {decided.get('reason') or decision}")
    arguments = decided.get("arguments")
    if decision not in ("approved", "edited") or not isinstance(arguments, Mapping):
        return Verdict(None, "refused: the approval decision is malformed", tampered=True)
    expected = requested.get("arguments_sha256")
    ok = arguments_sha256(arguments) == decided.get("arguments_sha256")
    ok = ok and decided.get("approved_sha256") == expected
    if decision == "approved":
        ok = ok and arguments_sha256(arguments) == expected
    if not ok:
        return Verdict(
            None,
            "refused: the arguments do not match what was approved (hash mismatch); "
            "nothing was sent",
            tampered=True,
        )
    return Verdict(
        arguments, edited_from=decided.get("edited_from") if decision == "edited" else None
    )
