"""What is stuck, and on whom (issue 43): ListRuns' waiting_longer_than, on the database clock."""

from __future__ import annotations

from datetime import timedelta

import grpc
import pytest

from agentrun.v1 import run_pb2, run_pb2_grpc
from control_plane.runs import wait_limits
from control_plane.server import start
from control_plane.store import runs
from tests.harness import auth
from tests.harness.approval_routes import (  # noqa: F401 (fixtures)
    config_fixture,
    http_fixture,
    pool_fixture,
)
from tests.harness.cli import agentrun_async
from tests.integration.test_approvals import hold


async def test_runs_waiting_longer_than_a_day_are_listed_and_nothing_else(pool, config, db_url):
    stuck, _ = await hold(pool)
    fresh, _ = await hold(pool)
    # The stuck one parked two days ago (tests move row times, never clocks).
    await pool.execute(
        "UPDATE runs SET updated_at = now() - interval '2 days' WHERE run_id = $1", stuck
    )
    await pool.execute(
        "UPDATE runs SET status = 'cancelled', wait_reason = NULL, finished_at = now(),"
        " updated_at = now() - interval '3 days' WHERE run_id = $1",
        fresh,
    )  # long untouched, but not waiting: not stuck
    server = await start(config)
    key = await auth.workspace_key(db_url, "ws", role="operator")
    channel = auth.channel(f"127.0.0.1:{server.port}", key)
    try:
        stub = run_pb2_grpc.RunServiceStub(channel)
        req = run_pb2.ListRunsRequest()
        req.waiting_longer_than.FromTimedelta(timedelta(days=1))
        listed = await stub.ListRuns(req)
        assert [r.run_id for r in listed.runs] == [str(stuck)]
        req.waiting_longer_than.FromTimedelta(timedelta(days=3))
        assert not (await stub.ListRuns(req)).runs
        req.waiting_longer_than.FromTimedelta(timedelta(seconds=-5))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.ListRuns(req)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "waiting_longer_than" in info.value.details()

        done = await agentrun_async(
            f"127.0.0.1:{server.port}", key, "runs", "list", "--waiting-longer-than", "1d", "-q",
            workspace="ws",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [str(stuck)]
    finally:
        await channel.close()
        await server.stop(grace=0)


async def test_a_run_waiting_past_its_kinds_limit_fails_and_off_is_a_choice(pool, config, db_url):
    too_long, approval_id = await hold(pool)
    await pool.execute(
        "UPDATE runs SET updated_at = now() - interval '2 days' WHERE run_id = $1", too_long
    )
    server = await start(config)
    key = await auth.workspace_key(db_url, "ws", role="admin")
    address = f"127.0.0.1:{server.port}"
    try:
        # The platform's default (30 days) leaves a 2-day wait alone.
        assert await wait_limits.fail_overdue(pool) == []
        done = await agentrun_async(
            address, key, "workspaces", "set-wait-limit", "approval", "1d", workspace="ws"
        )
        assert done.returncode == 0, done.stderr
        assert "approval 1d" in done.stdout and "human 30d" in done.stdout
        bad = await agentrun_async(
            address, key, "workspaces", "set-wait-limit", "approval", "5s", workspace="ws"
        )
        assert bad.returncode != 0 and "max_seconds" in bad.stderr
    finally:
        await server.stop(grace=0)
    failed = await wait_limits.fail_overdue(pool)
    assert [(r["run_id"], r["error"]) for r in failed] == [
        (too_long, "waited for approval longer than the workspace allows (86400 s)")
    ]
    run = await runs.get_run(pool, "ws", too_long)
    assert run.status == "failed"
    closed = await pool.fetchval("SELECT reason FROM approvals WHERE approval_id = $1", approval_id)
    assert closed == "run failed: waited for approval longer than the workspace allows (86400 s)"
    # Off, by choice: nothing fails however long it waits.
    other, _ = await hold(pool)
    await pool.execute(
        "UPDATE runs SET updated_at = now() - interval '400 days' WHERE run_id = $1", other
    )
    await pool.execute(
        "UPDATE workspaces SET wait_limits = '{\"approval\": 0}' WHERE workspace_id = 'ws'"
    )
    assert await wait_limits.fail_overdue(pool) == []
