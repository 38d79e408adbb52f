"""Commits of several runs arriving in one event-loop tick go as one statement (real
Postgres), each run fenced on its own: a fenced, duplicate or refused commit fails no other.
The statements go over connections the groups hold (lanes), handed back when asked."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from control_plane.dispatch import commits
from control_plane.dispatch.commits import CommitGroups
from control_plane.store import lease, runs, steps
from control_plane.store.errors import DataRefused, Fenced
from tests import factories
from tests.harness.waiting import eventually


@pytest.fixture
async def groups(pool) -> AsyncIterator[CommitGroups]:
    groups = CommitGroups(pool)
    yield groups
    await groups.close()  # else the pool's close waits for its lanes to go idle


def step(seq: int, kind: str = "model_decision", text: str = "") -> steps.NewStep:
    payload = json.dumps({"content": text or f"s{seq}", "tool_calls": []})
    return steps.NewStep(seq, kind, None, payload)


async def held_runs(pool, n: int) -> list[runs.Run]:
    await factories.queued_runs(pool, n)
    return await lease.claim_due(pool, ["ex-a"] * n, 30)


def request(run: runs.Run, new: list[steps.NewStep], **kw) -> steps.CommitRequest:
    return steps.CommitRequest(run.workspace_id, run.run_id, run.lease_epoch, new, **kw)


async def test_one_tick_of_commits_is_one_statement_and_each_run_lands_as_alone(pool, groups):
    renewing, parking, finishing = await held_runs(pool, 3)
    park = steps.Transition(status="waiting", wait_reason="sleep", wake_after_seconds=600)
    done = steps.Transition(status="completed", text="the end")
    results = await asyncio.gather(
        groups.commit(
            request(
                renewing, [step(1), step(2, "tool_started")], model_calls=1, tool_calls=1, tokens=12
            ),
            30,
        ),
        groups.commit(request(parking, [step(1), step(2, "park")], transition=park), 30),
        groups.commit(
            request(
                finishing,
                [step(1), step(2, "finish")],
                transition=done,
                tokens=5,
                refused_calls=2,
            ),
            30,
        ),
    )
    assert (groups.statements, groups.grouped) == (1, 3)
    assert [r.status for r in results] == ["running", "waiting", "completed"]
    rows = [
        await runs.get_run(pool, r.workspace_id, r.run_id) for r in (renewing, parking, finishing)
    ]
    renewed, parked, finished = rows
    assert (renewed.step_count, renewed.model_calls, renewed.tool_calls, renewed.tokens_used) == (
        3,
        1,
        1,
        12,
    )
    assert renewed.lease_owner == "ex-a" and results[0].wake_at == renewed.wake_at
    assert renewed.wake_at - renewed.updated_at == timedelta(seconds=30)
    assert (parked.wait_reason, parked.lease_owner) == ("sleep", None)
    assert parked.wake_at - parked.updated_at == timedelta(seconds=600)
    assert (finished.output, finished.tokens_used, finished.refused_calls) == ("the end", 5, 2)
    assert (results[2].refused_calls, results[2].tool_calls) == (2, 0)
    assert finished.finished_at is not None
    log = await steps.list_steps(pool, renewing.workspace_id, renewing.run_id, 0, 10)
    assert [(s.seq, s.kind, s.epoch) for s in log] == [
        (0, "input", 0),
        (1, "model_decision", renewing.lease_epoch),
        (2, "tool_started", renewing.lease_epoch),
    ]


async def test_a_tick_of_several_workspaces_is_one_statement_per_workspace(pool, groups):
    """A statement that locks runs of several workspaces spans shards on Citus, which
    refuses it: a tick's commits go as one statement per workspace, each landing."""
    await factories.queued_runs(pool, 2, "ws-one")
    await factories.queued_runs(pool, 1, "ws-two")
    held = await lease.claim_due(pool, ["ex-a"] * 3, 30)
    assert sorted(r.workspace_id for r in held) == ["ws-one", "ws-one", "ws-two"]
    results = await asyncio.gather(*(groups.commit(request(r, [step(1)]), 30) for r in held))
    assert (groups.statements, groups.grouped) == (2, 3)
    assert [r.status for r in results] == ["running"] * 3
    for r in held:
        assert (await runs.get_run(pool, r.workspace_id, r.run_id)).step_count == 2
    with pytest.raises(ValueError, match="one workspace"):
        await steps.commit_many(pool, [request(r, [step(2)]) for r in held], 30)


async def test_a_fenced_run_in_the_group_fails_alone(pool, groups):
    held = await held_runs(pool, 2)
    later = max(r.wake_at for r in held) + timedelta(seconds=1)
    (newer,) = await lease.claim_due(pool, ["ex-b"], 30, now=later)  # one lapsed lease taken
    (taken,) = [r for r in held if r.run_id == newer.run_id]
    (ours,) = [r for r in held if r.run_id != newer.run_id]
    landed, fenced = await asyncio.gather(
        groups.commit(request(ours, [step(1)]), 30),
        groups.commit(request(taken, [step(1)]), 30),
        return_exceptions=True,
    )
    assert groups.statements == 1
    assert isinstance(fenced, Fenced) and landed.status == "running"
    stale = await steps.list_steps(pool, taken.workspace_id, taken.run_id, 0, 10)
    assert [s.seq for s in stale] == [0]  # nothing of the fenced writer's
    assert (await runs.get_run(pool, taken.workspace_id, taken.run_id)).lease_epoch == (
        newer.lease_epoch
    )


async def test_a_duplicate_or_refused_commit_in_the_group_leaves_the_others_landed(pool, groups):
    first, retried, refused = await held_runs(pool, 3)
    await groups.commit(request(retried, [step(1)]), 30)  # landed; its reply "lost"
    results = await asyncio.gather(
        groups.commit(request(first, [step(1)]), 30),
        groups.commit(request(retried, [step(1)]), 30),
        groups.commit(request(refused, [step(1, text="\x00")]), 30),
        return_exceptions=True,
    )
    assert results[0].status == "running" and not results[0].duplicate
    assert results[1].duplicate
    assert isinstance(results[2], DataRefused)
    counts = [
        (await runs.get_run(pool, r.workspace_id, r.run_id)).step_count
        for r in (first, retried, refused)
    ]
    assert counts == [2, 2, 1]


async def test_two_commits_of_one_run_in_a_tick_go_in_separate_statements(pool, groups):
    (run,) = await held_runs(pool, 1)
    both = await asyncio.gather(
        groups.commit(request(run, [step(1)]), 30),
        groups.commit(request(run, [step(1)]), 30),  # a retry racing its first try
        return_exceptions=True,
    )
    assert groups.statements == 2
    assert sorted(r.duplicate for r in both) == [False, True]
    assert (await runs.get_run(pool, run.workspace_id, run.run_id)).step_count == 2


async def test_the_lane_is_held_between_statements_replaced_when_broken_and_handed_back(
    pool, groups, db
):
    (run,) = await held_runs(pool, 1)
    await groups.commit(request(run, [step(1)]), 30)
    await groups.commit(request(run, [step(2)]), 30)
    assert pool.get_size() - pool.get_idle_size() == 1  # one connection kept for the next
    # Postgres ends every backend of the pool, the lane's too (a restart, a failover).
    await db.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    errors = []
    for _ in range(3):  # the broken lane may fail the one commit sent before it is noticed
        try:
            await groups.commit(request(run, [step(3)]), 30)
            break
        except Exception as exc:  # noqa: BLE001 - counted below
            errors.append(exc)  # (asyncpg says so in more than one way: the session retries)
    assert len(errors) <= 1, errors
    assert (await runs.get_run(pool, run.workspace_id, run.run_id)).step_count == 4
    await groups.close()
    assert pool.get_idle_size() == pool.get_size()  # nothing held: the pool may close


async def test_an_idle_lane_goes_back_to_the_pool_on_its_own(pool, groups, monkeypatch):
    monkeypatch.setattr(commits, "LANE_IDLE_SECONDS", 0.2)
    (run,) = await held_runs(pool, 1)
    await groups.commit(request(run, [step(1)]), 30)
    assert pool.get_size() - pool.get_idle_size() == 1
    await eventually(
        lambda: pool.get_idle_size() == pool.get_size(),
        timeout=5,
        message="the idle lane was never handed back",
    )
    await groups.commit(request(run, [step(2)]), 30)  # a new lane, taken as the first was
    assert (await runs.get_run(pool, run.workspace_id, run.run_id)).step_count == 3
