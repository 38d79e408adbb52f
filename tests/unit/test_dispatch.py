"""Pure parts of dispatch: spreading a claim batch over executor credits."""

from __future__ import annotations

from types import SimpleNamespace

from control_plane.dispatch.dispatcher import owner_slots
from control_plane.dispatch.slots import Slots


def session(executor_id: str, credits: int) -> SimpleNamespace:
    return SimpleNamespace(executor_id=executor_id, slots=Slots(credits=credits))


def test_slots_round_robin_across_executors():
    owners = owner_slots([session("a", 3), session("b", 1), session("c", 2)], 10)
    assert owners == ["a", "b", "c", "a", "c", "a"]


def test_batch_caps_the_claim():
    assert owner_slots([session("a", 50), session("b", 50)], 4) == ["a", "b", "a", "b"]


def test_no_credits_no_claim():
    assert owner_slots([session("a", 0)], 10) == []
