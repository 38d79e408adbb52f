"""Argument constraints of an agent spec: validated at publish, stored as JSON with the version.

The executor enforces them (executor/constraints.py); here they are only
checked for shape, so that a version that cannot be enforced is never stored.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agentrun.v1 import agent_pb2
from control_plane.ground import validate
from control_plane.ground.errors import InvalidArgument

MAX_CONSTRAINTS = 64
MAX_KNOWN = 1000
RULES = {
    agent_pb2.CONSTRAINT_RULE_REPLY_TO_TRIGGER_THREAD: "reply_to_trigger_thread",
    agent_pb2.CONSTRAINT_RULE_ATTACHMENTS_FROM_TRIGGER_THREAD: "attachments_from_trigger_thread",
    agent_pb2.CONSTRAINT_RULE_RECIPIENT_KNOWN_OR_APPROVAL: "recipient_known_or_approval",
    agent_pb2.CONSTRAINT_RULE_AMOUNT_AT_MOST: "amount_at_most",
}
RULE_VALUES = {name: value for value, name in RULES.items()}


def validate_constraints(spec: agent_pb2.AgentSpec) -> None:
    if len(spec.constraints) > MAX_CONSTRAINTS:
        raise InvalidArgument("spec.constraints", f"has more than {MAX_CONSTRAINTS} rules")
    for i, c in enumerate(spec.constraints):
        where = f"spec.constraints[{i}]"
        if c.tool not in spec.tools:
            raise InvalidArgument(f"{where}.tool", f"names {c.tool[:64]!r}, not one of spec.tools")
        if c.rule not in RULES:
            raise InvalidArgument(f"{where}.rule", "must name a rule")
        validate.text(f"{where}.argument", c.argument, max_bytes=64)
        if c.rule == agent_pb2.CONSTRAINT_RULE_AMOUNT_AT_MOST and c.max_amount <= 0:
            raise InvalidArgument(f"{where}.max_amount", "must be positive for AMOUNT_AT_MOST")
        if len(c.known_recipients) > MAX_KNOWN:
            raise InvalidArgument(f"{where}.known_recipients", f"has more than {MAX_KNOWN}")
        for j, who in enumerate(c.known_recipients):
            validate.text(f"{where}.known_recipients[{j}]", who, max_bytes=320, required=True)


def to_json(constraints: Iterable[agent_pb2.ToolConstraint]) -> list[dict[str, Any]]:
    return [
        {
            "tool": c.tool,
            "rule": RULES[c.rule],
            "argument": c.argument,
            "max_amount": c.max_amount,
            "known_recipients": [who.strip().lower() for who in c.known_recipients],
        }
        for c in constraints
    ]


def from_json(data: list[dict[str, Any]]) -> list[agent_pb2.ToolConstraint]:
    return [
        agent_pb2.ToolConstraint(
            tool=c.get("tool", ""),
            rule=RULE_VALUES.get(c.get("rule", ""), 0),  # type: ignore[arg-type]
            argument=c.get("argument", ""),
            max_amount=c.get("max_amount", 0),
            known_recipients=c.get("known_recipients", []),
        )
        for c in data
    ]
