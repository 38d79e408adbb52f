"""AGENTRUN_EVENT_LOOP picks the loop the control plane and the executors run on."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from telemetry import event_loop


async def _loop_type() -> type:
    return type(asyncio.get_running_loop())


def test_uvloop_is_the_default_where_installed() -> None:
    assert event_loop.chosen({}) == "uvloop"


def test_the_switch_names_either_loop_in_any_case() -> None:
    assert event_loop.chosen({"AGENTRUN_EVENT_LOOP": " AsyncIO "}) == "asyncio"
    assert event_loop.chosen({"AGENTRUN_EVENT_LOOP": "uvloop"}) == "uvloop"


def test_an_unknown_loop_is_refused_naming_the_variable(monkeypatch) -> None:
    monkeypatch.setenv("AGENTRUN_EVENT_LOOP", "trio")
    coro = _loop_type()
    with pytest.raises(ValueError, match="AGENTRUN_EVENT_LOOP"):
        event_loop.run(coro)
    assert coro.cr_frame is None  # closed, never left dangling


@pytest.mark.parametrize(("name", "loop"), [("uvloop", uvloop.Loop), ("asyncio", None)])
def test_run_runs_on_the_chosen_loop(monkeypatch, name, loop) -> None:
    monkeypatch.setenv("AGENTRUN_EVENT_LOOP", name)
    ran_on = event_loop.run(_loop_type())
    if loop is None:
        assert not issubclass(ran_on, uvloop.Loop)
        assert issubclass(ran_on, asyncio.BaseEventLoop)
    else:
        assert issubclass(ran_on, loop)
