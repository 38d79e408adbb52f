"""The CLI as a user meets it, against a real control plane: agents as files, lists in three
formats, filters the server applies, empty lists and errors that say what to do."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from agentrun_cli.client import Client
from tests.harness.auth import workspace_key

WS = "cli-ws"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "triage.yaml"


class Cli:
    def __init__(self, address: str, key: str, tmp: Path) -> None:
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRUN_")}
        self.env.update(
            AGENTRUN_CONFIG=str(tmp / "config.toml"),
            AGENTRUN_DATA_DIR=str(tmp),
            AGENTRUN_API_KEY=key,
            AGENTRUN_ADDRESS=address,
            AGENTRUN_WORKSPACE=WS,
        )

    async def __call__(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "agentrun_cli", *args]
        done = await asyncio.to_thread(
            subprocess.run, argv, capture_output=True, text=True, timeout=60, env=self.env
        )
        assert "Traceback" not in done.stderr, done.stderr
        if ok:
            assert done.returncode == 0, f"{args}: {done.stderr}"
        return done


async def _cli(server, db_url: str, tmp_path: Path) -> Cli:
    key = await workspace_key(db_url, WS, role="admin")
    return Cli(f"127.0.0.1:{server.port}", key, tmp_path)


async def test_agents_apply_creates_publishes_only_changes_and_names_unknown_keys(
    server, db_url, tmp_path
):
    cli = await _cli(server, db_url, tmp_path)
    empty = await cli("agents", "list")
    assert empty.stdout == "" and "no agents in workspace 'cli-ws'" in empty.stderr
    assert "agents apply -f" in empty.stderr
    assert json.loads((await cli("agents", "list", "-o", "json")).stdout) == []

    first = await cli("agents", "apply", "-f", str(EXAMPLE))
    assert "created agent triage" in first.stdout and "published triage v1" in first.stdout
    again = await cli("agents", "apply", "-f", str(EXAMPLE), "-o", "json")
    assert json.loads(again.stdout)["published"] is False
    assert json.loads(again.stdout)["version"]["version"] == 1

    shown = json.loads((await cli("agents", "show", "triage", "-o", "json")).stdout)
    spec = shown["version"]["spec"]
    assert spec["limits"]["deadline"] == "600s" and spec["limits"]["max_age"] == "604800s"
    assert spec["approval"]["expiry_seconds"] == 86400
    assert spec["approval"]["on_expiry"] == "EXPIRY_ACTION_REJECT"
    assert spec["constraints"][0]["rule"] == "CONSTRAINT_RULE_RECIPIENT_KNOWN_OR_APPROVAL"
    assert spec["max_concurrency"] == 5

    changed = tmp_path / "changed.yaml"
    changed.write_text(EXAMPLE.read_text().replace("max_steps: 20", "max_steps: 21"))
    assert "published triage v2" in (await cli("agents", "apply", "-f", str(changed))).stdout

    typo = tmp_path / "typo.yaml"
    typo.write_text("agent: other\nmodel: demo\ntools: [crm_lookup]\nlimits: {max_step: 3}\n")
    refused = await cli("agents", "apply", "-f", str(typo), ok=False)
    assert refused.returncode == 1
    assert "unknown keys: limits.max_step (did you mean limits.max_steps?)" in refused.stderr
    lines = (await cli("agents", "list", "-o", "jsonl")).stdout.splitlines()
    assert [json.loads(line)["agent_id"] for line in lines] == ["triage"]  # nothing created
    assert json.loads(lines[0])["latest_version"] == 2


async def test_a_name_that_is_not_the_existing_agents_is_an_error_naming_both(
    server, db_url, tmp_path
):
    cli = await _cli(server, db_url, tmp_path)
    await cli("agents", "apply", "-f", str(EXAMPLE))  # creates triage, "Triage desk"
    renamed = tmp_path / "renamed.yaml"
    text = EXAMPLE.read_text().replace("name: Triage desk", "name: Support desk")
    text = text.replace("max_steps: 20", "max_steps: 21")
    renamed.write_text(text)
    refused = await cli("agents", "apply", "-f", str(renamed), ok=False)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        f"error: {renamed}: name: 'Support desk', but agent 'triage' is named 'Triage desk'; "
        "apply names an agent only when it creates it: write name: 'Triage desk' or leave it out"
    )
    shown = json.loads((await cli("agents", "show", "triage", "-o", "json")).stdout)
    assert shown["version"]["version"] == 1  # nothing published by the refused file
    unnamed = tmp_path / "unnamed.yaml"
    unnamed.write_text("\n".join(line for line in text.splitlines() if "name:" not in line))
    assert "published triage v2" in (await cli("agents", "apply", "-f", str(unnamed))).stdout


async def test_without_an_address_the_cli_dials_where_its_dev_stack_listens(
    server, db_url, tmp_path
):
    """A second checkout's `agentrun dev` binds another port when 50051 is taken and records
    it in its data dir (run/control-plane.port): that checkout's CLI dials it, and an error
    names the address it dialled and where that came from."""
    cli = await _cli(server, db_url, tmp_path)
    del cli.env["AGENTRUN_ADDRESS"]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "control-plane.port").write_text(f"127.0.0.1:{server.port}\n")
    listed = await cli("agents", "list", "-o", "json")
    assert json.loads(listed.stdout) == []
    cli.env["AGENTRUN_API_KEY"] = "not-a-key"
    refused = await cli("agents", "list", ok=False)
    assert refused.stderr.splitlines()[0].startswith("error: UNAUTHENTICATED")
    assert refused.stderr.splitlines()[1].startswith(
        f"hint: dialled 127.0.0.1:{server.port} (where `agentrun dev` with data dir "
        f"{tmp_path} listens, per run/control-plane.port); set AGENTRUN_API_KEY"
    ), refused.stderr
    (tmp_path / "run" / "control-plane.port").unlink()  # a stopped stack removes it
    refused = await cli("agents", "list", ok=False)
    assert (
        f"hint: dialled 127.0.0.1:50051 (the default; no `agentrun dev` with data dir "
        f"{tmp_path} is running)" in refused.stderr
    ), refused.stderr
    cli.env["AGENTRUN_ADDRESS"] = f"127.0.0.1:{server.port}"
    refused = await cli("agents", "list", ok=False)
    assert f"hint: dialled 127.0.0.1:{server.port} (AGENTRUN_ADDRESS); " in refused.stderr


async def test_runs_list_filters_on_the_server_and_prints_a_plain_table_when_piped(
    server, db_url, tmp_path
):
    cli = await _cli(server, db_url, tmp_path)
    await cli("agents", "create", "triage")
    await cli("agents", "publish", "triage", "--model", "demo", "--tool", "crm_lookup")
    nothing = await cli("runs", "list")
    assert "no runs in workspace 'cli-ws'" in nothing.stderr and "runs start" in nothing.stderr
    for text in ("Follow up with ada@example.com", "Call bob"):
        await cli("runs", "start", "triage", "--input", text)

    ada = (await cli("runs", "list", "--search", "ADA@example", "-q")).stdout.split()
    both = (await cli("runs", "list", "--since", "1h", "-q")).stdout.split()
    assert len(ada) == 1 and len(both) == 2 and ada[0] in both
    table = (await cli("runs", "list")).stdout.splitlines()
    assert table[0].split() == [
        "RUN",
        "ID",
        "AGENT",
        "STATUS",
        "WAIT",
        "CREATED",
        "ELAPSED",
        "ACTIVE",
        "STEPS",
        "TOKENS",
    ]
    assert len(table) == 3 and "\x1b[" not in "".join(table)
    assert all(line == line.rstrip() for line in table)
    # The filters are the server's (ListRuns create_after and search), not the CLI's.
    with Client(f"127.0.0.1:{server.port}", WS, key=cli.env["AGENTRUN_API_KEY"]) as client:
        later = datetime.now(UTC) + timedelta(minutes=5)
        assert await asyncio.to_thread(lambda: list(client.list_runs(since=later))) == []
        found = await asyncio.to_thread(lambda: list(client.list_runs(search="call BOB")))
        assert [r.input for r in found] == ["Call bob"]
    none = await cli("runs", "list", "--search", "nobody")
    assert none.stdout == "" and "match --search nobody" in none.stderr

    missing = await cli("runs", "show", "00000000-0000-0000-0000-000000000000", ok=False)
    assert missing.returncode == 1
    assert missing.stderr.startswith("error: NOT_FOUND") and "\nhint: " in missing.stderr
    too_long = await cli("runs", "list", "--search", "x" * 201, ok=False)
    assert (
        "INVALID_ARGUMENT: search" in too_long.stderr and "hint: fix the field" in too_long.stderr
    )
