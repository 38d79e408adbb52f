"""The claim's release rules at the store (real Postgres): who may take which run.

A run is on the release of its first claimer; only executors of that release (or of one
continuing it) take it again; a run on no release goes only to the newest release with a
connected executor that is not draining; a claim that could not deliver a run that never
ran gives its release back; only an explicit, audited move changes a waiting run's release.
"""

from __future__ import annotations

import json

import pytest

from control_plane.store import executor_tools, lease, steps
from control_plane.store import releases as store
from tests import factories


async def connect(pool, executor_id: str, release: str) -> None:
    """What a Hello records: the executor's row and its release."""
    await executor_tools.record(pool, executor_id, f"s-{executor_id}", release, None, [])
    await store.seen(pool, release)


def of(name: str, *continues: str) -> lease.Release:
    return lease.Release(name, continues)


async def claim(pool, owner: str, release: lease.Release):
    return await lease.claim_due(pool, [owner], 30, release=release)


async def hand_back(pool, run) -> None:
    """The holder commits one step and parks the run (a drain's hand-back)."""
    payload = json.dumps({"content": "work", "tool_calls": []})
    await steps.commit(
        pool,
        steps.CommitRequest(
            run.workspace_id,
            run.run_id,
            run.lease_epoch,
            [steps.NewStep(run.step_count, "model_decision", None, payload)],
            steps.Transition(status="waiting", wait_reason="handoff", wake_after_seconds=0),
        ),
        30,
    )


async def test_runs_stay_on_the_release_that_first_claimed_them(pool):
    await connect(pool, "a1", "A")
    await connect(pool, "b1", "B")  # first seen last: the newest
    first, second = await factories.queued_runs(pool, 2)
    assert await claim(pool, "a1", of("A")) == []  # new runs are B's
    (on_b,) = await claim(pool, "b1", of("B"))
    assert on_b.release == "B"

    assert await store.promote(pool, "A")  # an operator sends new runs back to A
    (on_a,) = await claim(pool, "a1", of("A"))
    assert on_a.release == "A" and {on_a.run_id, on_b.run_id} == {first.run_id, second.run_id}
    await hand_back(pool, on_a)
    assert await claim(pool, "b1", of("B")) == []  # B never continues A's run
    (again,) = await claim(pool, "c1", of("C", "A"))  # C declares it continues A
    assert again.run_id == on_a.run_id and again.release == "A"


async def test_a_draining_release_takes_no_new_runs(pool):
    await connect(pool, "a1", "A")
    await connect(pool, "b1", "B")
    assert await store.drain(pool, "B", 60)
    (run,) = await factories.queued_runs(pool, 1)
    assert await claim(pool, "b1", of("B")) == []
    (claimed,) = await claim(pool, "a1", of("A"))  # the newest not draining
    assert claimed.run_id == run.run_id and claimed.release == "A"
    (state_b,) = await store.list_releases(pool, 30, "B")
    assert state_b.draining_since is not None and not state_b.drained  # b1 is still there


async def test_an_undelivered_claim_of_a_run_that_never_ran_gives_its_release_back(pool):
    await connect(pool, "a1", "A")
    await factories.queued_runs(pool, 1)
    (claimed,) = await claim(pool, "a1", of("A"))
    await lease.release_unassigned(
        pool, lease.LeaseKey(claimed.workspace_id, claimed.run_id, claimed.lease_epoch)
    )
    await connect(pool, "b1", "B")
    (retaken,) = await claim(pool, "b1", of("B"))
    assert retaken.run_id == claimed.run_id and retaken.release == "B"


async def test_only_an_audited_move_changes_the_release_of_a_waiting_run(pool, db):
    await connect(pool, "a1", "A")
    (run,) = await factories.queued_runs(pool, 1)
    (held,) = await claim(pool, "a1", of("A"))
    move = store.Move(run.workspace_id, run.run_id, "B", "key:ops", "req-1")
    with pytest.raises(store.NotMovable):
        await store.move(pool, move)  # held: not movable
    await hand_back(pool, held)
    await connect(pool, "b1", "B")
    assert await claim(pool, "b1", of("B")) == []
    assert await store.move(pool, move) == "A"
    (moved,) = await claim(pool, "b1", of("B"))
    assert moved.run_id == run.run_id and moved.release == "B"
    audit = await db.fetch("SELECT actor, detail FROM audit_log WHERE action = 'run.move_release'")
    assert [(a["actor"], json.loads(a["detail"])) for a in audit] == [
        ("key:ops", {"from_release": "A", "to_release": "B"})
    ]


async def test_a_claimer_whose_hello_was_not_recorded_still_takes_new_runs(pool):
    """The claimers are connected themselves: a failed executor_tools record (a database
    blip at Hello) must not keep new runs from the only release there is."""
    await store.seen(pool, "A")
    (run,) = await factories.queued_runs(pool, 1)
    (claimed,) = await claim(pool, "a1", of("A"))
    assert claimed.run_id == run.run_id and claimed.release == "A"
