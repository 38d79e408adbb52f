"""A run whose task fails in a way nothing handles (a bug, an answer no check foresaw) parks
visibly, waits longer each time, and fails the fifth time: it is neither left to lapse and
crash every executor that takes it over, unseen, nor failed at its first stumble."""

from __future__ import annotations

import asyncio

from agentrun.v1 import agent_pb2, executor_pb2, run_pb2
from executor import replay
from executor.run_loop import CRASH_WAIT, MAX_CRASHES, RunDeps, RunLoop
from executor.tools.catalogue import Catalogue
from tests.unit.test_tool_run_loop import RUN, Committer, Delivery, Leases, payloads, step


class BrokenModel:
    """A model client with a bug: it raises what no caller expects, message and all."""

    def __init__(self) -> None:
        self.asked = 0

    async def complete(self, model, messages, tools, run_id, seq):
        self.asked += 1
        raise KeyError("sk-secret-in-a-message")


def crashed_before(times: int) -> list[run_pb2.Step]:
    """A log whose run failed `times` times already (its park steps say so)."""
    log = [step(0, replay.INPUT, {"text": "go"})]
    for i in range(times):
        park = {"wait_reason": CRASH_WAIT, "note": "earlier", "wake_after_seconds": 1.0}
        log.append(step(1 + i, replay.PARK, park))
    return log


async def run_once(log: list[run_pb2.Step]) -> tuple[str, Committer, BrokenModel]:
    committer, model = Committer(), BrokenModel()
    assignment = executor_pb2.Assignment(
        run=run_pb2.Run(workspace_id="ws", run_id=RUN, lease_epoch=3),
        agent_version=agent_pb2.AgentVersion(spec=agent_pb2.AgentSpec(model="m")),
        steps=log,
    )
    deps = RunDeps(committer, Leases(), model, Delivery(), Catalogue.load(), crash_backoff=2.0)  # type: ignore[arg-type]
    ended = await asyncio.wait_for(RunLoop(assignment, deps).run(), 5)
    return ended, committer, model


async def test_the_first_failure_parks_the_run_naming_the_failure_but_not_its_message():
    ended, committer, model = await run_once(crashed_before(0))
    assert (ended, model.asked) == ("parked", 1)
    (commit,) = committer.commits
    [(kind, park)] = payloads(commit)
    assert (kind, park["wait_reason"], park["wake_after_seconds"]) == ("park", CRASH_WAIT, 2.0)
    assert (commit.park.wait_reason, commit.park.wake_after.seconds) == (CRASH_WAIT, 2)
    assert park["note"].startswith(f"the run's task failed (1 of {MAX_CRASHES}) with KeyError in ")
    assert "complete (test_run_loop_crash.py:" in park["note"]
    assert "sk-secret" not in commit.SerializeToString().decode("utf-8", "replace")


async def test_each_failure_after_waits_twice_as_long():
    ended, committer, _ = await run_once(crashed_before(2))
    assert ended == "parked"
    [(_, park)] = payloads(committer.commits[0])
    assert park["wake_after_seconds"] == 8.0
    assert f"(3 of {MAX_CRASHES})" in park["note"]


async def test_the_fifth_failure_fails_the_run_naming_the_failure():
    ended, committer, _ = await run_once(crashed_before(MAX_CRASHES - 1))
    assert ended == "failed"
    (commit,) = committer.commits
    [(kind, finish)] = payloads(commit)
    assert (kind, finish["status"]) == ("finish", "failed")
    assert commit.fail.error == finish["error"]
    assert finish["error"].startswith(
        f"executor error: the run's task failed {MAX_CRASHES} times, the last with KeyError in "
    )
    assert "sk-secret" not in finish["error"]


async def test_other_parks_do_not_count_as_failures():
    log = [step(0, replay.INPUT, {"text": "go"})]
    log += [step(1 + i, replay.PARK, {"wait_reason": "model", "note": "429"}) for i in range(6)]
    ended, committer, _ = await run_once(log)
    assert ended == "parked"
    [(_, park)] = payloads(committer.commits[0])
    assert f"(1 of {MAX_CRASHES})" in park["note"]
