"""Retention through the API: the workspace setting (WorkspaceAdminService) and exporting a
run's steps as JSON lines with the CLI (`agentrun runs export`, built on ListRunSteps)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import asyncpg
import grpc
import pytest

from agentrun.v1 import admin_pb2, admin_pb2_grpc
from control_plane.store import lease, runs, steps
from tests import factories
from tests.harness import auth

WS = "keep-ws"


async def _admin(server, db_url: str, role: str = "admin"):
    key = await auth.workspace_key(db_url, WS, role=role)
    return auth.channel(f"127.0.0.1:{server.port}", key)


async def test_admins_set_retention_and_bad_values_name_the_field(server, db_url, db):
    async with await _admin(server, db_url) as ch:
        admin = admin_pb2_grpc.WorkspaceAdminServiceStub(ch)
        got = await admin.GetWorkspace(admin_pb2.GetWorkspaceRequest())
        assert got.workspace.retention_days == 0, "kept forever unless set"
        for bad in (-1, 36501):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await admin.SetWorkspaceRetention(
                    admin_pb2.SetWorkspaceRetentionRequest(retention_days=bad)
                )
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "retention_days" in err.value.details()
        assert (
            await db.fetchval("SELECT retention_days FROM workspaces WHERE workspace_id = $1", WS)
            == 0
        )
        req = admin_pb2.SetWorkspaceRetentionRequest(retention_days=30)
        assert (await admin.SetWorkspaceRetention(req)).workspace.retention_days == 30
        got = await admin.GetWorkspace(admin_pb2.GetWorkspaceRequest())
        assert got.workspace.retention_days == 30
        audit = await admin.ListAuditLog(admin_pb2.ListAuditLogRequest())
        assert audit.entries[0].action == "workspace.retention_changed"
    async with await _admin(server, db_url, role="operator") as ch:
        admin = admin_pb2_grpc.WorkspaceAdminServiceStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await admin.SetWorkspaceRetention(req)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def _run_with_steps(db_url: str, count: int) -> str:
    """A run with `count` committed steps after its input (more than a ListRunSteps page)."""
    pool = await asyncpg.create_pool(db_url, min_size=1, max_size=2)
    try:
        version = await factories.agent_version(pool, WS, "agent")
        adm = runs.Admission(
            workspace_id=WS,
            agent_id="agent",
            agent_version=version,
            input="go",
            request_id=None,
            max_steps=count + 10,
            max_tokens=1000,
            max_tool_calls=10,
            deadline_seconds=3600,
        )
        run = await runs.insert_run(pool, adm)
        assert run is not None
        (held,) = await lease.claim_due(pool, ["ex"], 30)
        payload = json.dumps({"content": "x", "tool_calls": []})
        new = [steps.NewStep(seq, "model_decision", None, payload) for seq in range(1, count + 1)]
        await steps.commit(pool, steps.CommitRequest(WS, run.run_id, held.lease_epoch, new), 30)
        return str(run.run_id)
    finally:
        await pool.close()


def _env(server, key: str, tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRUN_")}
    env.update(
        AGENTRUN_CONFIG=str(tmp_path / "config.toml"),
        AGENTRUN_DATA_DIR=str(tmp_path),
        AGENTRUN_API_KEY=key,
        AGENTRUN_ADDRESS=f"127.0.0.1:{server.port}",
        AGENTRUN_WORKSPACE=WS,
    )
    return env


async def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "agentrun_cli", *args]
    done = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, timeout=60, env=env
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


async def test_export_prints_every_step_once_as_json_lines(server, db_url, tmp_path):
    env = _env(server, await auth.workspace_key(db_url, WS, role="reader"), tmp_path)
    run_id = await _run_with_steps(db_url, 450)  # three pages of 200
    done = await _cli(env, "runs", "export", run_id)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [int(s.get("seq", 0)) for s in lines] == list(range(451))
    kinds = [s["kind"] for s in lines]
    assert kinds[0].endswith("INPUT") and set(kinds[1:]) == {kinds[1]}, set(kinds)
    gone = await _cli(env, "runs", "export", "00000000-0000-0000-0000-000000000000")
    assert gone.returncode == 1 and gone.stderr.startswith("error: NOT_FOUND")


async def test_cli_sets_retention_and_shows_the_refused_field(server, db_url, tmp_path):
    env = _env(server, await auth.workspace_key(db_url, WS, role="admin"), tmp_path)
    bad = await _cli(env, "workspaces", "set-retention", "--", "-1")
    assert bad.returncode == 1 and "INVALID_ARGUMENT: retention_days" in bad.stderr, bad.stderr
    done = await _cli(env, "workspaces", "set-retention", "7")
    assert done.returncode == 0, done.stderr
    assert "retention  7 days" in done.stdout
    shown = await _cli(env, "workspaces", "show")
    assert "retention  7 days" in shown.stdout, shown.stdout
