"""`agentrun runs start --tag`, `runs list --tag`, `runs cancel --tag X --all [--dry-run]` and
`runs pause|resume` as a user types them, against a real control plane (no executor: the
runs stay queued)."""

from __future__ import annotations

import json

from tests.harness.auth import workspace_key
from tests.harness.cli import agentrun_async

WS = "cli-orch"
AGENT = "agent: triage\nmodel: writer\ninstructions: be brief\n"


async def test_tags_bulk_cancel_and_pause_from_the_cli(server, db_url, tmp_path):
    key = await workspace_key(db_url, WS, role="admin")
    address = f"127.0.0.1:{server.port}"

    async def cli(*args: str, ok: bool = True):
        done = await agentrun_async(address, key, *args, workspace=WS)
        assert (done.returncode == 0) == ok, (args, done.stdout, done.stderr)
        return done

    spec = tmp_path / "triage.yaml"
    spec.write_text(AGENT)
    await cli("agents", "apply", "-f", str(spec))
    started = []
    for i in range(3):
        tags = ["--tag", "sweep", "--tag", f"n{i}"]
        out = await cli("runs", "start", "triage", "--input", "hi", *tags, "-o", "json")
        started.append(json.loads(out.stdout)["run"]["run_id"])
    await cli("runs", "start", "triage", "--input", "keep", "--metadata", '{"k": "v"}')

    listed = await cli("runs", "list", "--tag", "sweep", "-q")
    assert sorted(listed.stdout.split()) == sorted(started)
    assert (await cli("runs", "list", "--metadata", "k=v", "-q")).stdout.count("\n") == 1
    shown = await cli("runs", "show", started[0])
    assert "sweep, n0" in shown.stdout

    refused = await cli("runs", "cancel", "--tag", "sweep", ok=False)
    assert "--all" in refused.stderr
    bad = await cli("runs", "list", "--tag", "Not A Tag", ok=False)
    assert "tag" in bad.stderr

    paused = await cli("runs", "pause", "--agent", "triage")
    assert "agent triage paused (4 queued or waiting runs)" in paused.stdout
    one = await cli("runs", "pause", started[0])
    assert "[paused]" in one.stdout
    await cli("runs", "resume", started[0])
    await cli("runs", "resume", "--queue")

    dry = await cli("runs", "cancel", "--tag", "sweep", "--dry-run")
    assert "3 unfinished runs match; nothing cancelled" in dry.stdout
    done = await cli("runs", "cancel", "--tag", "sweep", "--all")
    assert "cancelled 3 of 3 runs" in done.stdout
    left = await cli("runs", "list", "--status", "queued", "-q")
    assert len(left.stdout.split()) == 1

    dry = await cli("runs", "rerun", "--tag", "sweep", "--dry-run")
    assert "3 runs match; nothing started" in dry.stdout
    again = await cli("runs", "rerun", "--tag", "sweep", "--all")
    assert "started 3 of 3 runs again (0 skipped)" in again.stdout
    fresh = await cli("runs", "list", "--tag", "sweep", "--status", "queued", "-q")
    assert len(fresh.stdout.split()) == 3
