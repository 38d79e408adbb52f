"""An approval outlives two deploys (issue 41): requested on release A, decided after B
and then C replaced it, the run continues on C, the newest, with no operator step.

The wait is two days of the database's clock: with the approval's expiry set to three
days, the test moves every time the run and its approval recorded two days into the past
(as if the database's clock had run on), then decides. A run waiting for a person waits
between turns, on no release: the pin is the turn's, not the run's.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg

from agentrun.v1 import approval_pb2, approval_pb2_grpc, release_pb2, release_pb2_grpc, run_pb2
from tests.harness import auth
from tests.harness.agentrun_api import Api, pending_approval, sent_mail
from tests.harness.waiting import eventually

APPROVER = "manager@example.com"
THREE_DAYS = 3 * 24 * 3600
TWO_DAYS = timedelta(days=2)


# What two days move, per table: the columns naming its row, the times moved.
MOVED = (
    ("approvals", ("workspace_id", "approval_id"), ("created_at", "expire_at")),
    ("steps", ("workspace_id", "run_id", "seq"), ("created_at",)),
    ("runs", ("workspace_id", "run_id"), ("created_at", "started_at")),
)


async def two_days_pass(db_url: str, run_id: str) -> None:
    """What two days of the database's clock do to a waiting run and its approval.

    The times are read, then written back as values: Citus refuses a stable function over
    a column (`created_at - interval`) in an UPDATE."""
    conn = await asyncpg.connect(db_url)
    try:
        async with conn.transaction():
            for table, keys, times in MOVED:
                rows = await conn.fetch(
                    f"SELECT {', '.join(keys + times)} FROM {table} WHERE run_id = $1", run_id
                )
                sets = ", ".join(f"{c} = ${i + 1}" for i, c in enumerate(times))
                where = " AND ".join(f"{c} = ${len(times) + i + 1}" for i, c in enumerate(keys))
                for row in rows:
                    moved = [row[c] and row[c] - TWO_DAYS for c in times]
                    await conn.execute(
                        f"UPDATE {table} SET {sets} WHERE {where}", *moved, *(row[c] for c in keys)
                    )
    finally:
        await conn.close()


async def test_an_approval_asked_on_a_and_decided_two_releases_later_runs_on_the_newest(
    db_url, control_plane, executor_factory, sandbox_providers
):
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url)
    policy = approval_pb2.ApprovalPolicy(
        tools=["send_email"], approvers=[APPROVER], expiry_seconds=THREE_DAYS
    )
    await api.publish("mailer", "approval", ["send_email"], approval=policy)
    admin = await auth.platform_key(db_url)
    ops = auth.channel(cp.address, admin)
    releases = release_pb2_grpc.ReleaseServiceStub(ops)
    key = await auth.workspace_key(db_url, api.ws, role="approver", principal=APPROVER)
    channel = auth.channel(cp.address, key)
    approvals = approval_pb2_grpc.ApprovalServiceStub(channel)

    (a,) = executor_factory(cp, AGENTRUN_RELEASE="A")
    run_id = await api.start("mailer", "email ada")
    approval = await pending_approval(api, approvals, run_id, APPROVER)
    assert (await api.get(run_id)).release == ""  # waiting for a person, on no release

    for old, new in (("A", "B"), ("B", "C")):  # two deploys, each replacing the last
        executor_factory(cp, AGENTRUN_RELEASE=new)

        async def serving(name: str = new) -> bool:
            listed = await releases.ListReleases(release_pb2.ListReleasesRequest())
            return any(r.name == name and r.executors and r.newest for r in listed.releases)

        await eventually(serving, timeout=30, message=f"{new} never became the newest")
        await releases.DrainRelease(release_pb2.DrainReleaseRequest(name=old))
        drained = await releases.GetRelease(release_pb2.GetReleaseRequest(name=old))

        async def gone(name: str = old) -> bool:
            got = await releases.GetRelease(release_pb2.GetReleaseRequest(name=name))
            return got.release.drained

        await eventually(gone, timeout=30, message=f"{old} never drained")
        assert drained.release.runs_waiting == 0
    await asyncio.to_thread(a.wait, 5)
    await two_days_pass(db_url, run_id)

    await approvals.DecideApproval(
        approval_pb2.DecideApprovalRequest(
            workspace_id=api.ws, approval_id=approval.approval_id, approve=approval_pb2.Approve()
        )
    )
    (done,) = await api.wait_terminal([run_id], within=40)
    assert done.status == run_pb2.RUN_STATUS_COMPLETED and done.release == "C", done
    resp = await api.runs.ListRunSteps(
        run_pb2.ListRunStepsRequest(workspace_id=api.ws, run_id=run_id, page_size=100)
    )
    steps = list(resp.steps)
    decided = next(s.seq for s in steps if s.kind == run_pb2.STEP_KIND_APPROVAL_DECIDED)
    before = {s.release for s in steps if s.seq < decided and s.epoch}
    after = {s.release for s in steps if s.seq > decided and s.epoch}
    assert before == {"A"} and after == {"C"}, steps
    first = min(s.create_time.ToDatetime() for s in steps)
    last = max(s.create_time.ToDatetime() for s in steps)
    assert (last - first).total_seconds() > 2 * 24 * 3600 - 60  # two days, by its own log
    assert len(sent_mail(sandbox_providers.url, run_id)) == 1
    await api.close()
    await channel.close()
    await ops.close()
