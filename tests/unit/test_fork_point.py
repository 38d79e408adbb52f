"""Which fork points leave a call open (refused) and which are safe: pure, from logs."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

from control_plane.runs.forks import fork_point_problem
from control_plane.store.steps import Step

RUN = uuid.uuid4()


def log(*entries: tuple[str, dict, int | None]) -> list[Step]:
    now = datetime.now(UTC)
    return [
        Step("ws", RUN, seq, kind, 0, ref, json.dumps(payload), now)
        for seq, (kind, payload, ref) in enumerate(entries)
    ]


DECISION = (
    "model_decision",
    {
        "tool_calls": [
            {"id": "c1", "name": "crm_lookup", "arguments": {}},
            {"id": "c2", "name": "send_email", "arguments": {}},
        ]
    },
    None,
)
STARTED_1 = ("tool_started", {"call_id": "c1", "tool": "crm_lookup"}, 1)
RESULT_1 = ("tool_result", {"call_id": "c1", "tool": "crm_lookup", "status": "ok"}, 2)
STARTED_2 = ("tool_started", {"call_id": "c2", "tool": "send_email"}, 1)
INPUT = ("input", {"text": "hi"}, None)


def test_after_a_result_at_the_input_or_before_a_call_starts_is_safe():
    steps = log(INPUT, DECISION, STARTED_1, RESULT_1, STARTED_2)
    assert fork_point_problem(steps[:1], 0) is None
    assert fork_point_problem(steps[:2], 1) is None  # the decision's calls were never sent
    # c1 answered, c2 not started yet: the fork starts c2, which was never sent by then.
    assert fork_point_problem(steps[:4], 3) is None


def test_a_started_call_without_its_result_is_refused_naming_it():
    steps = log(INPUT, DECISION, STARTED_1, RESULT_1, STARTED_2)
    problem = fork_point_problem(steps[:3], 2)
    assert problem is not None and "crm_lookup" in problem and "seq 2" in problem
    problem = fork_point_problem(steps, 4)
    assert problem is not None and "send_email" in problem and "seq 4" in problem


def test_held_awaiting_and_retried_calls_are_open():
    held = ("approval_requested", {"call_id": "c1", "tool": "crm_lookup"}, 1)
    approved = ("approval_decided", {"call_id": "c1", "decision": "approved"}, 2)
    unknown = ("tool_result", {"call_id": "c1", "status": "unknown", "awaiting": "human"}, 2)
    retry = ("tool_result", {"call_id": "c1", "decision": "retry"}, 3)
    for tail in ([held], [held, approved], [STARTED_1, unknown], [STARTED_1, unknown, retry]):
        steps = log(INPUT, DECISION, *tail)
        assert fork_point_problem(steps, len(steps) - 1) is not None, tail


def test_the_finish_and_a_missing_step_are_refused():
    steps = log(INPUT, ("model_decision", {"content": "done"}, None), ("finish", {}, None))
    assert "finish" in (fork_point_problem(steps, 2) or "")
    assert fork_point_problem(steps[:2], 1) is None
    assert "no step 5" in (fork_point_problem(steps, 5) or "")
