"""wait_for_signal in the executor: the park it commits and what a resumed open wait means."""

from __future__ import annotations

from agentrun.v1 import run_pb2
from executor import signal_wait
from executor.replay import Entry


def started(arguments: dict, created_at: float | None = 1000.0) -> Entry:
    payload = {"call_id": "c1", "tool": "wait_for_signal", "arguments": arguments}
    return Entry(3, run_pb2.STEP_KIND_TOOL_STARTED, 2, payload, created_at)


def test_a_wait_without_timeout_parks_with_no_wake_time():
    step, park = signal_wait.park(4, {"name": "approved"}, None)
    assert park.wait_reason == "signal" and park.WhichOneof("wake") is None
    assert step.kind == run_pb2.STEP_KIND_PARK and "approved" in step.payload_json


def test_a_wait_with_a_timeout_parks_until_it():
    _, park = signal_wait.park(4, {"name": "approved", "timeout": 30}, 30.0)
    assert park.WhichOneof("wake") == "wake_after" and park.wake_after.seconds == 30


def test_what_is_left_of_an_open_wait():
    assert signal_wait.remaining(started({"name": "x"}), now=5000.0) is None
    assert signal_wait.remaining(started({"name": "x", "timeout": 60}), now=1020.0) == 40.0
    assert signal_wait.remaining(started({"name": "x", "timeout": 60}), now=1070.0) == -10.0


def test_a_timed_out_wait_says_so_and_carries_no_payload():
    outcome = signal_wait.timed_out({"name": "x", "timeout": 5})
    assert outcome.status == "ok"
    assert outcome.output == {"name": "x", "timed_out": True, "payload": None, "timeout": 5.0}
