"""The fair claim's pure parts: what a queue position says (which workspaces get next_wake_at
raised is agentrun_claim()'s: tests/integration/test_fairness.py)."""

from __future__ import annotations

import pytest

from agentrun.v1 import run_pb2
from control_plane.ground import convert
from control_plane.store.lease import QueuePosition


def position(due=True, ws=(1, 2), agent=(0, None), ahead=3) -> QueuePosition:
    return QueuePosition(due, ahead, ws[0], ws[1], agent[0], agent[1])


@pytest.mark.parametrize(
    ("pos", "reason", "cause"),
    [
        (position(ws=(2, 2)), None, run_pb2.QUEUE_WAIT_CAUSE_WORKSPACE_CAP),
        (position(ws=(2, 2), agent=(1, 1)), None, run_pb2.QUEUE_WAIT_CAUSE_WORKSPACE_CAP),
        (position(agent=(1, 1)), None, run_pb2.QUEUE_WAIT_CAUSE_AGENT_CAP),
        (position(), None, run_pb2.QUEUE_WAIT_CAUSE_TURN),
        # Parked on a rate limit but due again: now it is the cap that holds it.
        (position(ws=(2, 2)), "rate", run_pb2.QUEUE_WAIT_CAUSE_WORKSPACE_CAP),
        (position(due=False), "rate", run_pb2.QUEUE_WAIT_CAUSE_RATE_LIMIT),
        (position(due=False), "model", run_pb2.QUEUE_WAIT_CAUSE_MODEL_UNAVAILABLE),
    ],
)
def test_the_cause_is_what_holds_the_run_back_now(pos, reason, cause):
    msg = convert.queue_position(pos, reason)
    assert msg is not None and msg.cause == cause
    assert (msg.runs_ahead, msg.workspace_running, msg.workspace_max_concurrency) == (
        pos.runs_ahead,
        pos.workspace_running,
        pos.workspace_max_concurrency,
    )


def test_a_sleep_is_no_queue():
    assert convert.queue_position(position(due=False), "sleep") is None


def test_an_agent_without_a_cap_reports_zero():
    assert convert.queue_position(position(), None).agent_max_concurrency == 0
