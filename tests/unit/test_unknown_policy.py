"""The unknown-outcome policy of an agent spec: stored as the question reads it, and checked."""

from __future__ import annotations

import pytest

from agentrun.v1 import agent_pb2
from agentrun_cli import agent_files
from control_plane.api.agents import validate_spec
from control_plane.approvals import unknown_outcome
from control_plane.ground import convert
from control_plane.ground.errors import InvalidArgument


def test_the_stored_policy_is_what_the_question_copies_and_reads_back_the_same():
    spec = agent_pb2.AgentSpec(
        model="m",
        unknown_outcome=agent_pb2.UnknownOutcomePolicy(
            ask=["starter", "ops@example.com"],
            slack=["U_OPS"],
            every_seconds=600,
            on_timeout=agent_pb2.UNKNOWN_OUTCOME_TIMEOUT_ESCALATE,
            escalate_to=["lead@example.com"],
            max_reminders=0,
        ),
    )
    validate_spec(spec)
    stored = convert.spec_to_json(spec, {})
    assert convert.spec_from_json(stored).unknown_outcome == spec.unknown_outcome
    found = unknown_outcome.Unknown(3, 2, {"tool": "post_chat"})
    q = unknown_outcome.question_for(stored, "person:dan@example.com", "ws", "r", found, {})
    assert (q.recipients, q.slack_recipients, q.every_seconds, q.on_timeout) == (
        ["dan@example.com", "ops@example.com"],
        ["U_OPS"],
        600,
        "escalate",
    )
    assert (q.escalate_to, q.max_reminders) == (["lead@example.com"], 0)
    # No policy: the approvers (else the admins), a day apart, two reminders; the stored
    # form of a spec without one is unchanged.
    plain = convert.spec_to_json(agent_pb2.AgentSpec(model="m"), {})
    assert "unknown_outcome" not in plain
    q = unknown_outcome.question_for(plain, None, "ws", "r", found, {})
    assert (q.recipients, q.every_seconds, q.max_reminders) == (["admin"], 86400, 2)


def test_an_escalation_without_anyone_to_escalate_to_is_refused_naming_the_field():
    spec = agent_pb2.AgentSpec(
        model="m",
        unknown_outcome=agent_pb2.UnknownOutcomePolicy(
            on_timeout=agent_pb2.UNKNOWN_OUTCOME_TIMEOUT_ESCALATE
        ),
    )
    with pytest.raises(InvalidArgument, match="spec.unknown_outcome.escalate_to"):
        validate_spec(spec)
    spec = agent_pb2.AgentSpec(
        model="m", unknown_outcome=agent_pb2.UnknownOutcomePolicy(every_seconds=-1)
    )
    with pytest.raises(InvalidArgument, match="spec.unknown_outcome.every_seconds"):
        validate_spec(spec)


def test_an_agent_file_says_it_with_a_duration_and_a_short_enum_name():
    doc = {
        "agent": "poster",
        "model": "m",
        "unknown_outcome": {"ask": ["starter"], "every": "4h", "on_timeout": "fail"},
    }
    pol = agent_files.parse(doc).spec.unknown_outcome
    assert (list(pol.ask), pol.every_seconds, pol.on_timeout) == (
        ["starter"],
        4 * 3600,
        agent_pb2.UNKNOWN_OUTCOME_TIMEOUT_FAIL,
    )
    doc["unknown_outcome"] = {"evry": "4h"}
    with pytest.raises(agent_files.AgentFileError, match="unknown_outcome.every"):
        agent_files.parse(doc)
