"""A new wait kind is a registered effect, and its writes are the commit's (real Postgres).

The effect below belongs to a made-up wait kind and is registered by this test alone, on the
pipeline the server assembles: no core file knows it. It runs in the commit's own
transaction (it sees the commit's steps before they are committed, which no other
transaction can, and its txid is the one that committed them), a fenced commit leaves
neither the steps nor its row, one that raises takes the steps down with it, and a resent
commit does it no second time.
"""

from __future__ import annotations

import functools
import json
from datetime import timedelta

import pytest

from agentrun.v1 import executor_pb2
from control_plane.dispatch import commits
from control_plane.dispatch.pipeline import CommitPipeline, Work
from control_plane.store import lease, runs, steps
from control_plane.store.db import Connection, Pool
from control_plane.store.errors import Fenced
from tests import factories
from tests.harness.commits import pipeline

WAIT = "made_up_wait"
# The transaction it runs in, and the steps of the run (with the xid that wrote each) as
# that transaction sees them.
MARK = """
INSERT INTO effect_marks (run_id, txid, seen)
SELECT $1, txid_current(), array_agg(ARRAY[seq, xmin::text::bigint] ORDER BY seq)
FROM steps WHERE run_id = $1
"""


class Marked:
    """A made-up wait kind's effect: a row saying which transaction it ran in."""

    def __init__(self, fails: bool = False) -> None:
        self.fails = fails
        self.prepared = 0

    async def prepare(
        self, db: Pool, req: steps.CommitRequest, msg: executor_pb2.Commit
    ) -> Work | None:
        self.prepared += 1
        return Work(functools.partial(self._mark, req))

    async def _mark(self, req: steps.CommitRequest, conn: Connection) -> bool:
        await conn.execute(MARK, req.run_id)
        if self.fails:
            raise RuntimeError("the made-up effect failed")
        return True  # as if another run became runnable


@pytest.fixture
async def marks(pool) -> None:
    await pool.execute(
        "CREATE TABLE effect_marks (run_id uuid NOT NULL, txid bigint NOT NULL, seen bigint[])"
    )


def assembled(pool, effect: Marked, pokes: list[str]) -> CommitPipeline:
    """The server's pipeline, every feature's effect in it, and this test's besides."""
    commits_pipeline = pipeline(pool, lambda: pokes.append("poke"))
    commits_pipeline.on_park(WAIT, effect)
    return commits_pipeline


async def held(pool) -> runs.Run:
    await factories.queued_runs(pool, 1)
    (run,) = await lease.claim_due(pool, ["ex-a"], 30)
    return run


def park(run: runs.Run) -> steps.CommitRequest:
    decision = json.dumps({"content": "wait for the made-up event", "tool_calls": []})
    return steps.CommitRequest(
        run.workspace_id,
        run.run_id,
        run.lease_epoch,
        [
            steps.NewStep(1, "model_decision", None, decision),
            steps.NewStep(2, "park", None, json.dumps({"wait_reason": WAIT})),
        ],
        steps.Transition(status="waiting", wait_reason=WAIT),
    )


async def log_of(pool, run: runs.Run) -> list[tuple[int, int]]:
    """(seq, the xid that wrote it) of each step of the run."""
    rows = await pool.fetch(
        "SELECT seq, xmin::text::bigint AS xid FROM steps WHERE run_id = $1 ORDER BY seq",
        run.run_id,
    )
    return [(r["seq"], r["xid"]) for r in rows]


async def test_a_registered_effect_runs_in_the_commits_transaction(pool, marks):
    run, effect, pokes = await held(pool), Marked(), []
    result = await assembled(pool, effect, pokes).commit(park(run), 30)

    assert (result.status, result.duplicate) == ("waiting", False)
    (mark,) = await pool.fetch("SELECT txid, seen, txid_status(txid) AS status FROM effect_marks")
    written = await log_of(pool, run)
    assert [seq for seq, _ in written] == [0, 1, 2]
    # The effect saw the new steps, the very row versions now committed, before their
    # commit: only the transaction that wrote them could. It committed with them.
    assert [tuple(pair) for pair in mark["seen"]] == written
    assert mark["status"] == "committed"
    (step_xid,) = {xid for seq, xid in written if seq > 0}
    # The fenced statement runs in a savepoint of that transaction (a resent commit's
    # unique violation must not abort it): its xid is a subtransaction's, after the
    # transaction's own (txid_current() is epoch << 32 | xid).
    assert step_xid > mark["txid"] % 2**32
    row = await runs.get_run(pool, run.workspace_id, run.run_id)
    assert (row.status, row.wait_reason, row.step_count) == ("waiting", WAIT, 3)
    assert pokes == ["poke"]  # after the transaction: another run may have become runnable

    # Resent (its reply lost): a duplicate, and the effect writes nothing again.
    again = await assembled(pool, effect, pokes).commit(park(run), 30)
    assert again.duplicate
    assert await pool.fetchval("SELECT count(*) FROM effect_marks") == 1
    assert pokes == ["poke"]


async def test_a_fenced_commit_leaves_neither_the_steps_nor_the_effects_row(pool, marks):
    stale, effect, pokes = await held(pool), Marked(), []
    later = stale.wake_at + timedelta(seconds=1)
    (taker,) = await lease.claim_due(pool, ["ex-b"], 30, now=later)  # its lease lapsed
    assert taker.lease_epoch == stale.lease_epoch + 1

    with pytest.raises(Fenced):
        await assembled(pool, effect, pokes).commit(park(stale), 30)

    assert [seq for seq, _ in await log_of(pool, stale)] == [0]
    assert await pool.fetchval("SELECT count(*) FROM effect_marks") == 0
    assert pokes == []
    row = await runs.get_run(pool, stale.workspace_id, stale.run_id)
    assert (row.status, row.lease_epoch, row.lease_owner) == ("running", taker.lease_epoch, "ex-b")


async def test_an_effect_that_raises_takes_the_steps_down_with_it(pool, marks):
    run, effect, pokes = await held(pool), Marked(fails=True), []

    with pytest.raises(RuntimeError, match="made-up effect failed"):
        await assembled(pool, effect, pokes).commit(park(run), 30)

    assert effect.prepared == 3  # an unexpected error: the whole commit tried again
    assert [seq for seq, _ in await log_of(pool, run)] == [0]
    assert await pool.fetchval("SELECT count(*) FROM effect_marks") == 0
    assert pokes == []
    row = await runs.get_run(pool, run.workspace_id, run.run_id)
    assert (row.status, row.lease_epoch, row.step_count) == ("running", run.lease_epoch, 1)


async def test_a_commit_that_calls_for_no_effect_goes_to_the_group_commit(pool, marks):
    run, effect, pokes = await held(pool), Marked(), []
    groups = commits.groups_for(pool)
    before = groups.statements
    decision = json.dumps({"content": "go on", "tool_calls": []})
    plain = steps.CommitRequest(
        run.workspace_id,
        run.run_id,
        run.lease_epoch,
        [steps.NewStep(1, "model_decision", None, decision)],
    )
    result = await assembled(pool, effect, pokes).commit(plain, 30)

    assert (result.status, groups.statements - before) == ("running", 1)
    assert effect.prepared == 0 and pokes == []
    assert await pool.fetchval("SELECT count(*) FROM effect_marks") == 0
