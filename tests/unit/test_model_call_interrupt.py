"""The drain deadline abandons an in-flight model call (nothing of it is committed, the run
is handed back); a fence, which cancels the run's task, still cancels it as before."""

from __future__ import annotations

import asyncio

import pytest

from agentrun.v1 import agent_pb2, executor_pb2, run_pb2
from executor import replay
from executor.run_loop import RunDeps, RunLoop
from executor.tools.catalogue import Catalogue
from tests.unit.test_tool_run_loop import RUN, Committer, Delivery, Leases, payloads, step


class HangingModel:
    """A provider that never answers; says when it was asked and when it was cancelled."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def complete(self, model, messages, tools, run_id, seq):
        self.asked.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


def held_run(model: HangingModel) -> tuple[RunLoop, Committer]:
    committer = Committer()
    assignment = executor_pb2.Assignment(
        run=run_pb2.Run(workspace_id="ws", run_id=RUN, lease_epoch=3),
        agent_version=agent_pb2.AgentVersion(spec=agent_pb2.AgentSpec(model="m")),
        steps=[step(0, replay.INPUT, {"text": "go"})],
    )
    deps = RunDeps(committer, Leases(), model, Delivery(), Catalogue.load())  # type: ignore[arg-type]
    return RunLoop(assignment, deps), committer


async def test_the_drain_deadline_abandons_the_model_call_and_hands_the_run_back():
    model = HangingModel()
    loop, committer = held_run(model)
    task = asyncio.create_task(loop.run())
    await asyncio.wait_for(model.asked.wait(), 5)
    loop.interrupt()
    assert await asyncio.wait_for(task, 5) == "parked"
    assert model.cancelled.is_set()
    (commit,) = committer.commits
    [(kind, park)] = payloads(commit)
    assert (kind, park["wait_reason"]) == ("park", "handoff")
    assert "model call abandoned" in park["note"]


async def test_cancelling_the_run_in_a_model_call_cancels_both_and_commits_nothing():
    model = HangingModel()
    loop, committer = held_run(model)
    task = asyncio.create_task(loop.run())
    await asyncio.wait_for(model.asked.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert model.cancelled.is_set()
    assert committer.commits == []
