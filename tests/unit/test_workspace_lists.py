"""A value_allowed rule's workspace_list (issue 48): checked at publish, merged into the
assignment's copy of the rule as the rule's own allowlist is normalised."""

from __future__ import annotations

import pytest

from agentrun.v1 import agent_pb2
from control_plane.ground import constraints
from control_plane.ground.errors import InvalidArgument

VALUE_ALLOWED = agent_pb2.CONSTRAINT_RULE_VALUE_ALLOWED


def spec(*rules: agent_pb2.ToolConstraint) -> agent_pb2.AgentSpec:
    return agent_pb2.AgentSpec(tools=["pay", "mail"], constraints=rules)


def test_a_rule_with_only_a_workspace_list_publishes_and_a_bad_name_is_named() -> None:
    payees = agent_pb2.ToolConstraint(
        tool="pay",
        rule=VALUE_ALLOWED,
        value_kind=agent_pb2.VALUE_KIND_IBAN,
        workspace_list="payees",
    )
    constraints.validate_constraints(spec(payees))
    bad = agent_pb2.ToolConstraint()
    bad.CopyFrom(payees)
    bad.workspace_list = "Payees!"
    with pytest.raises(InvalidArgument, match=r"spec.constraints\[0\].workspace_list"):
        constraints.validate_constraints(spec(bad))
    untrusted = agent_pb2.ToolConstraint(
        tool="pay", rule=agent_pb2.CONSTRAINT_RULE_UNTRUSTED_VALUE, workspace_list="payees"
    )
    with pytest.raises(InvalidArgument, match="workspace_list: is for VALUE_ALLOWED"):
        constraints.validate_constraints(spec(untrusted))
    with pytest.raises(InvalidArgument, match=r"allowlist.values\[1\]"):
        constraints.validate_allowlist("allowlist", "payees", ["GB33BUKB20201555555555", ""])


def test_the_named_lists_are_merged_normalised_and_a_missing_list_adds_nothing() -> None:
    s = spec(
        agent_pb2.ToolConstraint(
            tool="pay",
            rule=VALUE_ALLOWED,
            value_kind=agent_pb2.VALUE_KIND_IBAN,
            allowed=["DE89370400440532013000"],
            workspace_list="payees",
        ),
        agent_pb2.ToolConstraint(
            tool="mail",
            rule=VALUE_ALLOWED,
            value_kind=agent_pb2.VALUE_KIND_EMAIL,
            workspace_list="partners",
        ),
    )
    assert constraints.workspace_lists(s) == ["partners", "payees"]
    constraints.merge_workspace_lists(s, {"payees": ["gb33 bukb 2020 1555 5555 55"]})
    assert list(s.constraints[0].allowed) == ["DE89370400440532013000", "GB33BUKB20201555555555"]
    assert list(s.constraints[1].allowed) == []
    # Stored and read back as the spec is (to_json/from_json keep the list's name).
    (back,) = constraints.from_json(constraints.to_json([s.constraints[1]]))
    assert back.workspace_list == "partners"
