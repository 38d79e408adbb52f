"""A commit renews the lease only when it needs it (store/sql/lease.sql, "Renewing on commit").

Real Postgres with the database clock fixed per call, and the executor's own LeaseKeeper on
one shared clock with it: commits with more than half the lease left leave wake_at alone
(and are HOT updates), the executor never counts a lease longer than the one recorded, a
run that commits often but never heartbeats keeps its lease and is still fenced and taken
over exactly when it lapses, and over a real stream only an executor whose Hello says it
reads renewals gets commits that do not renew.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta

import grpc
import pytest

from agentrun.v1 import executor_pb2, executor_pb2_grpc, run_pb2
from control_plane.credits import pricing
from control_plane.store import lease, queries, runs, steps
from control_plane.store.errors import Fenced
from executor.lease import LeaseKeeper
from tests import factories
from tests.harness import auth

LEASE = 30.0  # the server's default, which the stream test's control plane uses too
HOT = """SELECT pg_stat_get_xact_tuples_updated('runs'::regclass) AS updated,
                pg_stat_get_xact_tuples_hot_updated('runs'::regclass) AS hot"""


def step(seq: int) -> steps.NewStep:
    return steps.NewStep(seq, "model_decision", None, json.dumps({"content": f"s{seq}"}))


def request(run: runs.Run, seq: int, renew_always: bool = False) -> steps.CommitRequest:
    return steps.CommitRequest(
        run.workspace_id, run.run_id, run.lease_epoch, [step(seq)], renew_always=renew_always
    )


async def claimed(pool, n: int = 1) -> tuple[list[runs.Run], datetime]:
    """n runs held by ex-a, and the database time t0 of the claim (wake_at = t0 + LEASE)."""
    await factories.queued_runs(pool, n)
    held = await lease.claim_due(pool, ["ex-a"] * n, LEASE)
    assert len(held) == n
    return held, held[0].wake_at - timedelta(seconds=LEASE)


def at(t0: datetime, seconds: float) -> datetime:
    return t0 + timedelta(seconds=seconds)


@pytest.mark.plain_postgres(
    "it reads the runs table's HOT-update counters, which on Citus are the shards' on the workers"
)
async def test_a_commit_renews_only_once_half_the_lease_is_left_and_is_hot_before(pool):
    (run,), t0 = await claimed(pool)
    async with pool.acquire() as conn, conn.transaction():
        before = await conn.fetchrow(HOT)  # may hold this backend's earlier, unflushed counts
        early = [
            await steps.commit(conn, request(run, seq), LEASE, now=at(t0, s))
            for seq, s in ((1, 1), (2, 14.9))
        ]
        after = await conn.fetchrow(HOT)
    assert [(r.renewed, r.wake_at) for r in early] == [(False, run.wake_at)] * 2
    # Both updates were HOT: no index entry written.
    assert (after["updated"] - before["updated"], after["hot"] - before["hot"]) == (2, 2)
    due = await steps.commit(pool, request(run, 3), LEASE, now=at(t0, 15))
    assert (due.renewed, due.wake_at) == (True, at(t0, 15 + LEASE))
    # An executor that counts every commit as a renewal gets one every time, as before.
    old = await steps.commit(pool, request(run, 4, renew_always=True), LEASE, now=at(t0, 16))
    assert (old.renewed, old.wake_at) == (True, at(t0, 16 + LEASE))
    row = await runs.get_run(pool, run.workspace_id, run.run_id)
    assert (row.wake_at, row.step_count, row.lease_epoch) == (old.wake_at, 5, run.lease_epoch)


async def test_grouped_commits_decide_each_run_alone(pool):
    (lazy, always), _ = await claimed(pool, 2)
    results = await steps.commit_many(
        pool, [request(lazy, 1), request(always, 1, renew_always=True)], LEASE
    )
    assert not isinstance(results[0], BaseException) and not isinstance(results[1], BaseException)
    assert (results[0].renewed, results[0].wake_at) == (False, lazy.wake_at)
    assert results[1].renewed and results[1].wake_at >= always.wake_at


# What a commit may change on the run row (updated_at aside: each statement's own now()).
ROW = """SELECT status, lease_owner, lease_epoch, wake_at, step_count, model_calls, tool_calls,
                tokens_used, input_tokens, output_tokens, cached_tokens, reasoning_tokens,
                cost_micros, refused_calls, wait_reason, waiting_connection_id, output, error,
                finished_at,
                held_since, active_seconds
         FROM runs WHERE workspace_id = $1 AND run_id = $2"""


async def test_a_commit_that_keeps_the_lease_leaves_the_row_as_the_general_statement(pool):
    """What steps.commit sends without a transition (run_commit_keep while more than half
    the lease is left, run_commit once the renewal is due) writes what run_commit writes
    for :status NULL, lazy and due alike, and returns the same row."""
    (general, keep), t0 = await claimed(pool, 2)
    sql = queries.QUERIES["run_commit"]
    for seq, t in ((1, 1.0), (2, 16.0)):  # more than half the lease left, then not
        usage = pricing.Usage(11, 7, 3, 2, 55)
        args = dict(
            workspace_id=general.workspace_id,
            run_id=general.run_id,
            epoch=general.lease_epoch,
            seqs=[seq],
            kinds=["model_decision"],
            ref_seqs=[None],
            payloads=[json.dumps({"content": f"s{seq}"})],
            model_calls=1,
            tool_calls=2,
            refused_calls=1,
            tokens=18,
            input_tokens=11,
            output_tokens=7,
            cached_tokens=3,
            reasoning_tokens=2,
            cost_micros=55,
            status=None,
            wait_reason=None,
            wake_at=None,
            wake_after_seconds=None,
            lease_seconds=LEASE,
            text=None,
            now=at(t0, t),
            waiting_connection_id=None,
            renew_always=False,
            between_turns=False,
        )
        row = await pool.fetchrow(sql.sql, *queries.arguments(sql, (), args))
        req = steps.CommitRequest(
            keep.workspace_id,
            keep.run_id,
            keep.lease_epoch,
            [step(seq)],
            model_calls=1,
            tool_calls=2,
            tokens=18,
            usage=usage,
            refused_calls=1,
        )
        result = await steps.commit(pool, replace(req, renew_always=False), LEASE, now=at(t0, t))
        expected = (row["status"], row["wake_at"], row["renewed"])
        assert (result.status, result.wake_at, result.renewed) == expected
        assert result.renewed == (t > LEASE / 2)
        rows = [await pool.fetchrow(ROW, r.workspace_id, r.run_id) for r in (general, keep)]
        assert dict(rows[0]) == dict(rows[1])


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def reported(result: steps.CommitResult) -> executor_pb2.CommitResult:
    """What the session answers the executor (lease_expire_time only on a renewal)."""
    reply = executor_pb2.CommitResult(outcome=executor_pb2.COMMIT_OUTCOME_OK)
    if result.renewed and result.wake_at is not None:
        reply.lease_expire_time.FromDatetime(result.wake_at)
    return reply


async def test_an_executor_that_commits_without_heartbeats_never_outlives_its_lease(pool):
    """Executor time t is database time t0 + t (the keeper's hold starts with the claim).
    Commits every 3 s keep the lease with no heartbeat; the executor's lease never exceeds
    the recorded one; once commits stop it fences itself before the run can be taken over,
    the run is taken over only when wake_at passes, and the old holder's commit is fenced."""
    (run,), t0 = await claimed(pool)
    clock, fenced = Clock(), []
    keeper = LeaseKeeper(
        _no_heartbeat,
        lambda run_id, why: fenced.append(run_id),
        clock=clock,
        lease_duration=LEASE,
        heartbeat_interval=10,
    )
    grant = executor_pb2.Lease(
        workspace_id=run.workspace_id, run_id=str(run.run_id), epoch=run.lease_epoch
    )
    keeper.hold(grant)
    renewals, wake_at = 0, run.wake_at
    for seq, t in enumerate(range(3, 61, 3), start=1):
        clock.now = t
        assert keeper.is_safe(grant.run_id), f"lost the lease at {t} s while committing"
        result = await steps.commit(pool, request(run, seq), LEASE, now=at(t0, t))
        keeper.committed(grant.run_id, grant.epoch, reported(result), sent_at=t)
        renewals, wake_at = renewals + result.renewed, result.wake_at
        assert at(t0, keeper.get(grant.run_id).valid_until) <= wake_at, f"overestimated at {t}"
    assert renewals == 4 and wake_at == at(t0, 60 + LEASE)  # at 15, 30, 45 and 60 s only
    # A long tool call: no commit, no heartbeat. The keeper gives the run up first...
    clock.now = 60 + LEASE - keeper.margin
    await keeper.tick()
    assert fenced == [grant.run_id]
    assert await lease.claim_due(pool, ["ex-b"], LEASE, now=at(t0, 60 + LEASE - 0.001)) == []
    # ...and the run is taken over when its recorded lease lapses, fencing the old holder.
    (taken,) = await lease.claim_due(pool, ["ex-b"], LEASE, now=at(t0, 60 + LEASE))
    assert (taken.lease_epoch, taken.lease_owner) == (run.lease_epoch + 1, "ex-b")
    with pytest.raises(Fenced):
        await steps.commit(pool, request(run, 99), LEASE, now=at(t0, 60 + LEASE))


async def _no_heartbeat(leases, reply_within):
    raise AssertionError("this executor never heartbeats")


async def commit_over_stream(address: str, key: str, run: runs.Run, hello: executor_pb2.Hello):
    """Connect as an executor, commit one step of `run` (held by it), return the result."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = executor_pb2_grpc.ExecutorServiceStub(channel)
        call = stub.Connect(metadata=(("authorization", f"Bearer {key}"),), timeout=20)
        await call.write(executor_pb2.ConnectRequest(hello=hello))
        assert (await call.read()).HasField("welcome")
        grant = executor_pb2.Lease(
            workspace_id=run.workspace_id, run_id=str(run.run_id), epoch=run.lease_epoch
        )
        new = executor_pb2.NewStep(
            seq=1, kind=run_pb2.STEP_KIND_MODEL_DECISION, payload_json=json.dumps({"content": "hi"})
        )
        commit = executor_pb2.Commit(request_id=1, lease=grant, steps=[new])
        await call.write(executor_pb2.ConnectRequest(commit=commit))
        while not (reply := await call.read()).HasField("commit_result"):
            pass
        await call.done_writing()
        return reply.commit_result


async def test_only_an_executor_that_reads_renewals_gets_commits_that_do_not_renew(
    server, db_url, pool
):
    (lazy, old), _ = await claimed(pool, 2)
    address, key = f"127.0.0.1:{server.port}", await auth.executor_key(db_url)
    hello = executor_pb2.Hello(executor_id="ex-a", capacity=0, reads_commit_renewal=True)
    kept = await commit_over_stream(address, key, lazy, hello)
    assert kept.outcome == executor_pb2.COMMIT_OUTCOME_OK
    assert not kept.HasField("lease_expire_time")
    row = await runs.get_run(pool, lazy.workspace_id, lazy.run_id)
    assert (row.wake_at, row.step_count) == (lazy.wake_at, 2)
    # An older executor (no flag) counts every commit as a renewal: each one renews.
    renewed = await commit_over_stream(address, key, old, executor_pb2.Hello(executor_id="ex-a"))
    assert renewed.outcome == executor_pb2.COMMIT_OUTCOME_OK
    row = await runs.get_run(pool, old.workspace_id, old.run_id)
    assert renewed.lease_expire_time.ToDatetime(tzinfo=row.wake_at.tzinfo) == row.wake_at
    assert row.wake_at > old.wake_at
