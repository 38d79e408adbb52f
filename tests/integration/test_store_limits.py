"""Active time, max age and the step counter in the run row (real Postgres).

The deadline counts the time executors hold a run (active_seconds, plus the
current hold from held_since); parked time never counts. Max age counts from
admission, parked or not.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from control_plane.dispatch import max_age
from control_plane.store import lease, runs, steps
from tests import factories


def key(row) -> lease.LeaseKey:
    return lease.LeaseKey(row.workspace_id, row.run_id, row.lease_epoch)


def decision(seq: int) -> steps.NewStep:
    return steps.NewStep(seq, "model_decision", None, json.dumps({"content": "x"}))


async def admit(pool, deadline_seconds: int = 60, max_age_seconds: int = 0):
    version = await factories.agent_version(pool)
    return await runs.insert_run(
        pool,
        runs.Admission(
            workspace_id="ws",
            agent_id="agent",
            agent_version=version,
            input="hi",
            request_id=None,
            max_steps=50,
            max_tokens=100_000,
            max_tool_calls=100,
            deadline_seconds=deadline_seconds,
            max_age_seconds=max_age_seconds,
        ),
    )


async def get(pool, run):
    return await runs.get_run(pool, run.workspace_id, run.run_id)


async def test_parked_time_does_not_count_toward_the_deadline(pool):
    run = await admit(pool, deadline_seconds=60)
    (held,) = await lease.claim_due(pool, ["ex-a"], 30)
    assert held.held_since is not None and held.active_seconds == 0
    park = steps.Transition("waiting", wait_reason="sleep", wake_after_seconds=0)
    await steps.commit(
        pool, steps.CommitRequest("ws", run.run_id, held.lease_epoch, [decision(1)], park), 30
    )
    parked = await get(pool, run)
    assert parked.held_since is None
    assert 0 <= parked.active_seconds < 5  # the hold's own seconds, nothing more

    # Woken three hours later (the claim's clock), the run is within its 60 s deadline.
    later = parked.wake_at + timedelta(hours=3)
    (woken,) = await lease.claim_due(pool, ["ex-b"], 30, now=later)
    assert woken.active_seconds == parked.active_seconds
    out = await lease.heartbeat(pool, "ex-b", [key(woken)], 30, now=later + timedelta(seconds=50))
    assert set(out.renewed) == {key(woken)}
    out = await lease.heartbeat(pool, "ex-b", [key(woken)], 30, now=later + timedelta(seconds=61))
    assert out.renewed == {} and out.past_deadline == {key(woken)}
    failed = await get(pool, run)
    assert (failed.status, failed.error) == ("failed", "deadline exceeded")


async def test_a_takeover_counts_the_lapsed_hold_up_to_its_lease_expiry(pool):
    run = await admit(pool)
    (a,) = await lease.claim_due(pool, ["ex-a"], 10)
    lapsed = a.wake_at + timedelta(minutes=5)  # nobody held it for five minutes
    (b,) = await lease.claim_due(pool, ["ex-b"], 10, now=lapsed)
    assert b.lease_epoch == a.lease_epoch + 1
    assert b.active_seconds == pytest.approx((a.wake_at - a.held_since).total_seconds())
    assert b.held_since == lapsed
    assert (await get(pool, run)).attempt == 1


async def test_a_cancel_ends_the_hold(pool):
    run = await admit(pool)
    await lease.claim_due(pool, ["ex-a"], 30)
    cancelled = await runs.cancel_run(pool, "ws", run.run_id, "stop")
    assert cancelled.held_since is None and cancelled.active_seconds >= 0


async def test_max_age_fails_a_held_run_at_its_heartbeat(pool):
    run = await admit(pool, deadline_seconds=3600, max_age_seconds=60)
    assert run.expires_at == run.created_at + timedelta(seconds=60)
    (held,) = await lease.claim_due(pool, ["ex-a"], 30)
    out = await lease.heartbeat(pool, "ex-a", [key(held)], 30, now=run.expires_at)
    assert out.renewed == {} and out.past_max_age == {key(held)} and out.past_deadline == set()
    row = await get(pool, run)
    assert (row.status, row.error) == ("failed", "max age exceeded")


async def test_the_sweep_fails_parked_runs_past_max_age_and_only_those(pool):
    young = await admit(pool, max_age_seconds=3600)
    old = await admit(pool, max_age_seconds=1)
    ageless = await admit(pool)
    # Parked on an event that never comes (wake_at NULL), past its max age.
    await pool.execute(
        "UPDATE runs SET status = 'waiting', wait_reason = 'human', wake_at = NULL,"
        " expires_at = now() - interval '1 s' WHERE run_id = $1",
        old.run_id,
    )
    freed = []
    assert await max_age.sweep(pool, lambda: freed.append(1)) == 1
    assert freed == [1]
    row = await get(pool, old)
    assert (row.status, row.error, row.wait_reason) == ("failed", "max age exceeded", None)
    log = await steps.list_steps(pool, "ws", old.run_id, 0, 10)
    assert [s.kind for s in log] == ["input", "finish"] and row.step_count == 2
    assert (await get(pool, young)).status == "queued"
    assert (await get(pool, ageless)).status == "queued"
    assert await max_age.sweep(pool, lambda: None) == 0


async def test_fail_held_is_fenced_by_the_epoch(pool):
    run = await admit(pool)
    (held,) = await lease.claim_due(pool, ["ex-a"], 30)
    stale = lease.LeaseKey("ws", run.run_id, held.lease_epoch - 1)
    assert await lease.fail_held(pool, stale, "nope") is False
    assert await lease.fail_held(pool, key(held), "internal error (request abc)") is True
    row = await get(pool, run)
    assert (row.status, row.error, row.step_count) == ("failed", "internal error (request abc)", 2)
    assert await lease.fail_held(pool, key(held), "again") is False


async def test_the_step_counter_counts_every_step_of_the_log(pool):
    run = await admit(pool)
    assert run.step_count == 1  # the input step, counted by the admission itself
    assert (await get(pool, run)).step_count == 1  # the input step
    (held,) = await lease.claim_due(pool, ["ex-a"], 30)
    await steps.commit(
        pool,
        steps.CommitRequest("ws", run.run_id, held.lease_epoch, [decision(1), decision(2)]),
        30,
    )
    await runs.cancel_run(pool, "ws", run.run_id, "stop")
    row = await get(pool, run)
    assert row.step_count == len(await steps.list_steps(pool, "ws", run.run_id, 0, 10)) == 4
