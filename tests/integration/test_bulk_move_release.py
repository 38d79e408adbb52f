"""Bulk move between releases (issue 45, item 5): ReleaseService.BulkMoveRunsRelease moves
the runs nobody holds that a ListRuns filter matches to another release, as MoveRunRelease
moves one, counted first, audited once, in batches. A real control plane and Postgres; no
executor (nothing claims, so the runs stay where the test puts them)."""

from __future__ import annotations

import json

import asyncpg
import grpc
import pytest

from agentrun.v1 import release_pb2, release_pb2_grpc, run_pb2
from tests.harness import auth
from tests.harness.agentrun_api import Api
from tests.harness.cli import agentrun_async


async def drain(stub, request) -> list[release_pb2.BulkMoveRunsReleaseResponse]:
    return [p async for p in stub.BulkMoveRunsRelease(request)]


async def test_a_filter_moves_the_runs_nobody_holds_audited_once(db_url, control_plane):
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url, "acme")
    channel = auth.channel(cp.address, await auth.platform_key(db_url))
    stub = release_pb2_grpc.ReleaseServiceStub(channel)
    db = await asyncpg.connect(db_url)
    try:
        await api.publish("worker", "writer", [])
        tagged = []
        for i in range(5):
            resp = await api.runs.StartRun(
                run_pb2.StartRunRequest(
                    workspace_id="acme", agent_id="worker", input=f"r{i}", tags=["move"]
                )
            )
            tagged.append(resp.run.run_id)
        other = await api.start("worker", "untagged")
        # One of the tagged runs is held by an executor: it stays where it is.
        await db.execute(
            "UPDATE runs SET status = 'running', lease_owner = 'ex-1', held_since = now(),"
            " wake_at = now() + interval '1 hour', release = 'A'"
            " WHERE workspace_id = 'acme' AND run_id = $1::uuid",
            tagged[0],
        )
        wanted = run_pb2.RunFilter(tag="move")

        (dry,) = await drain(
            stub,
            release_pb2.BulkMoveRunsReleaseRequest(
                workspace_id="acme", filter=wanted, release="B", dry_run=True
            ),
        )
        assert (dry.matched, dry.done, dry.dry_run, dry.finished) == (5, 0, True, True)
        progress = await drain(
            stub,
            release_pb2.BulkMoveRunsReleaseRequest(workspace_id="acme", filter=wanted, release="B"),
        )
        last = progress[-1]
        assert (last.matched, last.done, last.skipped, last.finished) == (5, 4, 1, True)

        rows = await db.fetch("SELECT run_id::text, release FROM runs WHERE workspace_id = 'acme'")
        where = {r["run_id"]: r["release"] for r in rows}
        assert [where[r] for r in tagged] == ["A", "B", "B", "B", "B"]
        assert where[other] is None
        audited = await db.fetch(
            "SELECT object_id, detail FROM audit_log WHERE workspace_id = 'acme'"
            " AND action = 'runs.bulk_moved_release'"
        )
        assert [a["object_id"] for a in audited] == [last.action_id]
        detail = json.loads(audited[0]["detail"])
        assert (detail["matched"], detail["to_release"], detail["filter"]) == (
            5,
            "B",
            {"tag": "move"},
        )

        # Refusals name what is wrong; a workspace's own key may not move runs.
        for bad, field in (
            (release_pb2.BulkMoveRunsReleaseRequest(workspace_id="acme"), "filter"),
            (
                release_pb2.BulkMoveRunsReleaseRequest(
                    workspace_id="acme", filter=wanted, release="no such/release"
                ),
                "release",
            ),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await drain(stub, bad)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert field in (err.value.details() or "")
        mine = release_pb2_grpc.ReleaseServiceStub(api.channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await drain(
                mine,
                release_pb2.BulkMoveRunsReleaseRequest(workspace_id="acme", filter=wanted),
            )
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await db.close()
        await channel.close()
        await api.close()


async def test_the_cli_moves_the_runs_a_filter_matches_with_a_dry_run_and_progress(
    server, db_url, tmp_path
):
    """`agentrun releases move --tag T --all --release B` as an operator types it: the
    filter flags of `runs cancel`, --dry-run counts, a RUN_ID and a filter are refused
    together, and the moved runs are on B (a held one stays)."""
    ws = "cli-move"
    address = f"127.0.0.1:{server.port}"
    own, platform = await auth.workspace_key(db_url, ws), await auth.platform_key(db_url)

    async def cli(key: str, *args: str, ok: bool = True):
        done = await agentrun_async(address, key, *args, workspace=ws)
        assert (done.returncode == 0) == ok, (args, done.stdout, done.stderr)
        return done

    spec = tmp_path / "mover.yaml"
    spec.write_text("agent: mover\nmodel: writer\ninstructions: be brief\n")
    await cli(own, "agents", "apply", "-f", str(spec))
    for i in range(4):
        await cli(own, "runs", "start", "mover", "--input", f"r{i}", "--tag", "eu")
    await cli(own, "runs", "start", "mover", "--input", "stays", "--tag", "us")
    db = await asyncpg.connect(db_url)
    try:
        held = await db.fetchval(
            "UPDATE runs SET status = 'running', lease_owner = 'ex-1', held_since = now(),"
            " wake_at = now() + interval '1 hour' WHERE run_id = (SELECT run_id FROM runs"
            " WHERE workspace_id = $1 AND input = 'r0') RETURNING run_id::text",
            ws,
        )
        refused = await cli(platform, "releases", "move", "--tag", "eu", "--release", "B", ok=False)
        assert "--all" in refused.stderr
        both = await cli(platform, "releases", "move", held, "--tag", "eu", "--all", ok=False)
        assert "not both" in both.stderr
        dry = await cli(platform, "releases", "move", "--tag", "eu", "--release", "B", "--dry-run")
        assert "4 unfinished runs match; nothing moved (--dry-run)" in dry.stdout
        done = await cli(platform, "releases", "move", "--tag", "eu", "--all", "--release", "B")
        assert "moved 3 of 4 runs to release B (1 held or finished)" in done.stdout
        assert "moved 0 of 4" in done.stderr  # progress, after the count
        rows = await db.fetch("SELECT input, release FROM runs WHERE workspace_id = $1", ws)
        assert {r["input"]: r["release"] for r in rows} == {
            "r0": None,
            "r1": "B",
            "r2": "B",
            "r3": "B",
            "stays": None,
        }  # before the one-run move below
        stays = await db.fetchval(
            "SELECT run_id::text FROM runs WHERE workspace_id = $1 AND input = 'stays'", ws
        )
        one = await cli(platform, "releases", "move", stays, "--release", "B")
        assert f"run {stays}: release (none) -> B" in one.stdout
        # A workspace's own key may not move runs: the server says so.
        mine = await cli(own, "releases", "move", "--tag", "eu", "--all", ok=False)
        assert "PERMISSION_DENIED" in mine.stderr or "permission" in mine.stderr.lower()
    finally:
        await db.close()
