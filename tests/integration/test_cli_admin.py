"""The admin CLI as real processes against a real control plane: workspaces, keys, members,
audit; a revoked key is refused; no key text is printed except by the one create."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.auth import platform_key
from tests.harness.waiting import eventually

KEY = re.compile(r"agr_(?:ws|ex|pa)_[a-z0-9]{16}_[A-Za-z0-9_-]{43}")


class Cli:
    """Runs `python -m agentrun_cli` with its own config file and no dev credentials."""

    def __init__(self, address: str, tmp: Path) -> None:
        self.address = address
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRUN_")}
        self.env.update(AGENTRUN_CONFIG=str(tmp / "config.toml"), AGENTRUN_DATA_DIR=str(tmp))
        self.outputs: list[tuple[list[str], str]] = []  # every command's stdout + stderr

    async def run(
        self, *args: str, key: str | None = None, stdin: str | None = None, ok: bool = True
    ) -> subprocess.CompletedProcess[str]:
        env = {**self.env, **({"AGENTRUN_API_KEY": key} if key else {})}
        argv = [sys.executable, "-m", "agentrun_cli", "--address", self.address, *args]
        done = await asyncio.to_thread(
            subprocess.run, argv, input=stdin, capture_output=True, text=True, timeout=60, env=env
        )
        self.outputs.append((list(args), done.stdout + done.stderr))
        if ok:
            assert done.returncode == 0, f"{args}: {done.stderr}"
        return done

    async def create_key(self, *args: str, key: str | None = None) -> str:
        done = await self.run("apikeys", "create", *args, key=key)
        assert "not shown again" in done.stderr
        text = done.stdout.strip()
        assert KEY.fullmatch(text), done.stdout
        return text


async def test_admin_commands_end_to_end(control_plane, db_url, tmp_path):
    cp = control_plane(db_url, AGENTRUN_KEY_CACHE_SECONDS="1")
    cli = Cli(cp.address, tmp_path)
    platform = await platform_key(db_url, "ops-lead")

    done = await cli.run("workspaces", "create", "acme", "--plan", "team", key=platform)
    assert "created workspace acme" in done.stdout and "team" in done.stdout
    again = await cli.run("workspaces", "create", "acme", key=platform, ok=False)
    assert again.returncode == 1 and "ALREADY_EXISTS" in again.stderr

    # A platform admin mints the workspace's first admin key; it goes into a profile.
    admin = await cli.create_key(
        "--workspace", "acme", "--role", "admin", "--name", "acme-admin", key=platform
    )
    await cli.run(
        "profile",
        "set",
        "acme",
        "--address",
        cp.address,
        "--workspace",
        "acme",
        "--api-key-stdin",
        stdin=admin + "\n",
    )
    shown = (await cli.run("profile", "show", "acme")).stdout
    assert admin.split("_")[2] in shown  # the key id, never the secret

    ops = await cli.create_key(
        "--profile", "acme", "--role", "operator", "--name", "ci-bot", "--expires-in", "30d"
    )
    ops_id = ops.split("_")[2]
    listed = (await cli.run("--profile", "acme", "apikeys", "list")).stdout
    row = next(line for line in listed.splitlines() if line.startswith(ops_id))
    assert "ci-bot" in row and "operator of acme" in row and "expires" in row

    # The operator key works until it is revoked; then every call is refused.
    await cli.run("--workspace", "acme", "runs", "list", key=ops)
    revoked = await cli.run("--profile", "acme", "apikeys", "revoke", ops_id)
    assert f"revoked key {ops_id}" in revoked.stdout

    async def refused() -> bool:
        done = await cli.run("--workspace", "acme", "runs", "list", key=ops, ok=False)
        return done.returncode == 1 and "UNAUTHENTICATED" in done.stderr

    await eventually(refused, timeout=5, interval=0.2, message="revoked key still accepted")
    listed = (await cli.run("--profile", "acme", "apikeys", "list")).stdout
    assert "revoked" in next(line for line in listed.splitlines() if line.startswith(ops_id))

    # Members: people who sign in, by email.
    await cli.run("--profile", "acme", "members", "add", "ada@example.com", "--role", "approver")
    members = (await cli.run("--profile", "acme", "members", "list")).stdout
    assert "ada@example.com" in members and "approver" in members
    await cli.run("--profile", "acme", "members", "remove", "ada@example.com")

    # Executor credentials: a platform admin's; listed among the platform's keys.
    pool = await cli.create_key("--executor", "--name", "gpu-pool", "--scope", "acme", key=platform)
    platform_keys = (await cli.run("apikeys", "list", "--platform", key=platform)).stdout
    assert "gpu-pool" in platform_keys and "executor of acme" in platform_keys
    refused_ws = await cli.run(
        "--profile", "acme", "apikeys", "create", "--executor", "--name", "x", ok=False
    )
    assert "PERMISSION_DENIED" in refused_ws.stderr

    audit = (await cli.run("--profile", "acme", "audit")).stdout.splitlines()
    assert audit[0].split()[:3] == ["when", "who", "what"]
    actions = [(line.split()[1], line.split()[2]) for line in audit[1:]]
    assert ("platform:ops-lead", "workspace.created") in actions
    assert ("platform:ops-lead", "key.created") in actions
    assert ("key:acme-admin", "key.created") in actions
    assert ("key:acme-admin", "key.revoked") in actions
    assert ("key:acme-admin", "member.added") in actions
    revoked_row = next(line for line in audit if "key.revoked" in line)
    assert f"api_key:{ops_id}" in revoked_row
    assert re.search(r"\s[0-9a-f-]{8,}\s", revoked_row), "no request id"  # who/what/object/id
    as_json = await cli.run("--json", "--profile", "acme", "audit", "--limit", "2")
    entries = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert len(entries) == 2 and entries[-1]["action"] == "member.removed"

    # No key text anywhere but in the stdout of the one command that created it.
    for secret in (admin, ops, pool, platform):
        where = [args for args, out in cli.outputs if secret in out]
        assert len(where) <= 1, (secret[:24], where)
        assert not where or where[0][:2] == ["apikeys", "create"], where


@pytest.mark.parametrize("bad", ["0d", "soon", "1y", "P1M"])
async def test_expires_in_must_be_a_duration(bad, tmp_path):
    cli = Cli("127.0.0.1:1", tmp_path)
    done = await cli.run(
        "apikeys", "create", "--role", "reader", "--name", "n", "--expires-in", bad, ok=False
    )
    assert done.returncode == 2 and "--expires-in" in done.stderr
