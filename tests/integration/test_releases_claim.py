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


async def hand_back(pool, run, between_turns: bool = False) -> None:
    """The holder commits one step and parks the run: a drain's hand-back of a turn in
    progress (it stays on its release), or `between_turns` (a sleep, say: on no release)."""
    payload = json.dumps({"content": "work", "tool_calls": []})
    reason = "sleep" if between_turns else "handoff"
    await steps.commit(
        pool,
        steps.CommitRequest(
            run.workspace_id,
            run.run_id,
            run.lease_epoch,
            [steps.NewStep(run.step_count, "model_decision", None, payload)],
            steps.Transition(
                status="waiting",
                wait_reason=reason,
                wake_after_seconds=0,
                between_turns=between_turns,
            ),
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


async def park_between_turns(pool, run) -> None:
    await hand_back(pool, run, between_turns=True)


async def share(pool, release: str) -> tuple[int, int]:
    row = await pool.fetchrow("SELECT lo, hi FROM release_share($1, 30, false)", release)
    return row["lo"], row["hi"]


async def test_a_run_parked_between_turns_continues_on_the_newest_release(pool):
    await connect(pool, "a1", "A")
    (run,) = await factories.queued_runs(pool, 1)
    (held,) = await claim(pool, "a1", of("A"))
    await park_between_turns(pool, held)
    row = await pool.fetchrow("SELECT release FROM runs WHERE run_id = $1", run.run_id)
    assert row["release"] is None  # waiting on no release
    await connect(pool, "b1", "B")  # first seen last: the newest
    assert await claim(pool, "a1", of("A")) == []
    (woke,) = await claim(pool, "b1", of("B"))
    assert woke.run_id == run.run_id and woke.release == "B"


async def test_a_ramp_sends_its_share_of_new_runs_and_a_rollback_strands_none(pool):
    """`releases ramp B 10`: of 1,000 new runs, B takes those whose bucket (a hash of the
    run id) is under 10, A the rest, every run exactly one of them; a rollback gives A all
    of them again, the runs B parked between turns included."""
    await connect(pool, "b1", "B")
    await connect(pool, "a1", "A")
    assert await store.promote(pool, "A")
    assert await store.ramp(pool, "B", 10)
    assert await share(pool, "A") == (10, 100) and await share(pool, "B") == (0, 10)
    runs = await factories.queued_runs(pool, 1000)
    counts = await pool.fetchrow(
        """SELECT count(*) FILTER (WHERE release_takes(run_id, 0, 10)) AS b,
                  count(*) FILTER (WHERE release_takes(run_id, 10, 100)) AS a
           FROM unnest($1::uuid[]) AS r(run_id)""",
        [r.run_id for r in runs],
    )
    print(f"ramp 10%: B {counts['b']} of 1000, A {counts['a']}")
    assert 70 <= counts["b"] <= 130 and counts["a"] + counts["b"] == 1000
    (on_b,) = await claim(pool, "b1", of("B"))
    bucket = await pool.fetchval("SELECT release_takes($1, 0, 10)", on_b.run_id)
    assert on_b.release == "B" and bucket
    await park_between_turns(pool, on_b)
    (state_b,) = await store.list_releases(pool, 30, "B")
    assert state_b.ramp_percent == 10

    assert await store.rollback(pool, "B", None)
    assert await share(pool, "B") == (0, 0) and await share(pool, "A") == (0, 100)
    assert await claim(pool, "b1", of("B")) == []
    taken = await lease.claim_due(pool, [f"a{i}" for i in range(8)], 30, release=of("A"))
    assert len(taken) == 8 and {r.release for r in taken} == {"A"}
    (state_b,) = await store.list_releases(pool, 30, "B")
    assert state_b.ramp_percent is None and state_b.rolled_back_at is not None
    assert state_b.runs_waiting == 0  # nothing stranded on B


async def test_a_run_whose_log_is_newer_than_a_release_reads_is_never_given_to_it(pool):
    """B writes step-log version 2; rolled back to A, which reads only version 1, the run
    B parked waits for a release that reads version 2 (C), and never goes to A."""
    await connect(pool, "a1", "A")
    await connect(pool, "b1", "B")
    await store.declared(pool, "B", 2, 1)
    (run,) = await factories.queued_runs(pool, 1)
    (on_b,) = await claim(pool, "b1", of("B"))
    row = await pool.fetchrow("SELECT log_version FROM runs WHERE run_id = $1", run.run_id)
    assert row["log_version"] == 2  # the claim records what its claimer writes
    await park_between_turns(pool, on_b)
    assert await store.rollback(pool, "B", None)
    assert await claim(pool, "a1", of("A")) == []  # A reads version 1 only
    await connect(pool, "c1", "C")
    await store.declared(pool, "C", 2, 1)
    (on_c,) = await claim(pool, "c1", of("C"))
    assert on_c.run_id == run.run_id and on_c.release == "C"
