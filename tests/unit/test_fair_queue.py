"""The fair claim's pure parts: what a queue position says, which workspaces get next_wake_at raised."""

from __future__ import annotations

import pytest

from agentrun.v1 import run_pb2
from control_plane.api import convert
from control_plane.store import lease
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
        pos.runs_ahead, pos.workspace_running, pos.workspace_max_concurrency,
    )  # fmt: skip


def test_a_sleep_is_no_queue():
    assert convert.queue_position(position(due=False), "sleep") is None


def test_an_agent_without_a_cap_reports_zero():
    assert convert.queue_position(position(), None).agent_max_concurrency == 0


class Conn:
    """Answers the store's named queries; remembers them."""

    def __init__(self, locked: list[str]) -> None:
        self.locked = locked
        self.calls: list[tuple[str, tuple]] = []


async def raise_for(turns, claimed, locked, monkeypatch, kept=()) -> list[tuple[str, tuple]]:
    conn = Conn(locked)

    async def run(c, name, *args):
        c.calls.append((name, args))
        return (
            [{"workspace_id": w} for w in c.locked] if name == "workspace_lock_for_raise" else None
        )

    monkeypatch.setattr(lease, "run", run)
    await lease._raise_next_wake(conn, turns, claimed, kept)  # type: ignore[arg-type]
    return conn.calls


async def test_only_workspaces_that_got_less_than_their_room_are_looked_at_again(monkeypatch):
    turns = [{"workspace_id": "full", "room": 2}, {"workspace_id": "short", "room": 3}]
    claimed = ["full", "full", "short"]  # the workspace of each claimed run
    calls = await raise_for(turns, claimed, ["short"], monkeypatch)
    assert calls == [
        ("workspace_lock_for_raise", (["short"],)),
        ("workspace_raise_next_wake", (["short"],)),
    ]


async def test_no_raise_when_every_workspace_filled_its_room_or_none_could_be_locked(monkeypatch):
    assert await raise_for([{"workspace_id": "a", "room": 1}], ["a"], [],
                           monkeypatch) == []  # fmt: skip
    calls = await raise_for([{"workspace_id": "a", "room": 2}], [], [], monkeypatch)
    assert [name for name, _ in calls] == ["workspace_lock_for_raise"]


async def test_a_workspace_the_claim_left_a_due_run_in_is_not_raised(monkeypatch):
    turns = [{"workspace_id": "kept", "room": 5}, {"workspace_id": "short", "room": 5}]
    calls = await raise_for(turns, ["kept", "short"], ["short"], monkeypatch, kept={"kept"})
    assert calls[0] == ("workspace_lock_for_raise", (["short"],))
