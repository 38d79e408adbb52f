"""The TypeScript client (clients/typescript) against a real `agentrun dev`: its node:test suite,
built with the machine's Node and run here, so `make test` runs it.

Node and npm are part of a development machine (Debian: `apt-get install nodejs npm`): without
them this test fails saying so, never skips. `npm ci` runs only when node_modules is missing or
older than package-lock.json (a stamp holds the lock's digest), so a warm run costs the build
and the tests alone.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess

import pytest

from agentrun_cli.devstack import EmbeddedRedis
from tests.harness.agentrun_dev import REPO, clean_env, running_dev
from tests.harness.servers import scratch_dir

TS = REPO / "clients" / "typescript"
STAMP = TS / "node_modules" / ".agentrun-lock-sha256"
AGENT_FILES = [REPO / "examples" / "triage.yaml", *sorted((TS / "test" / "agents").glob("*.yaml"))]
# What the issue asks the client's tests to show, by the start of their names.
MUST_PASS = [
    "start: a retried start with the same key returns the same run",
    "start: an answer lost to the network is retried with the same key, one run",
    "start: a 503 is retried with backoff",
    "errors: problem details as AgentRunError",
    "watch from an offset",
    "watch: a dropped stream resumes with Last-Event-ID",
    "approve: the run waits for the approver",
    "deny: the approver rejects with a reason",
    "the rest: agents, forks, sessions, signals",
    "cancel: a working run is cancelled",
    "list: paging past 200 runs",
    "src/schema.d.ts is current with docs/openapi.json",
    "events, comments, multi-line data",
]


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(
            f"`{name}` is not on PATH: the TypeScript client's tests need Node.js >= 18 and npm "
            "(Debian: apt-get install nodejs npm)",
            pytrace=False,
        )
    return found


def _run(argv: list[str], timeout: float, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=TS,
        env={**clean_env(), "NO_COLOR": "1", **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _shown(done: subprocess.CompletedProcess[str]) -> str:
    return f"$ {' '.join(done.args)}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"


def _installed(npm: str) -> None:
    """`npm ci`, unless node_modules already holds exactly what package-lock.json says."""
    digest = hashlib.sha256((TS / "package-lock.json").read_bytes()).hexdigest()
    if STAMP.is_file() and STAMP.read_text() == digest:
        return
    done = _run([npm, "ci", "--no-audit", "--no-fund"], timeout=300)
    assert done.returncode == 0, _shown(done)
    STAMP.write_text(digest)


def test_the_typescript_client_against_agentrun_dev(
    db_url: str, redis_server: EmbeddedRedis
) -> None:
    node, npm = _tool("node"), _tool("npm")
    version = subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()
    found = re.match(r"v(\d+)", version)
    major = int(found.group(1)) if found else 0
    assert major >= 18, f"node {version}: the client needs Node.js >= 18 (fetch, ReadableStream)"
    _installed(npm)
    built = _run([npm, "run", "build"], timeout=180)
    assert built.returncode == 0, _shown(built)
    assert (TS / "dist" / "index.js").is_file() and (TS / "dist" / "index.d.ts").is_file()

    with (
        scratch_dir("agentrun-ts-client-") as data_dir,
        running_dev(
            data_dir,
            "--address",
            "127.0.0.1:0",
            DATABASE_URL=db_url,
            REDIS_URL=redis_server.url,
            AGENTRUN_HTTP_LISTEN="127.0.0.1:0",
        ) as dev,
    ):
        for path in AGENT_FILES:
            applied = dev.cli("agents", "apply", "-f", str(path))
            assert applied.returncode == 0, applied.stdout + applied.stderr
        admin, approver = dev.cli("dev-key"), dev.cli("dev-key", "--role", "approver")
        assert admin.returncode == 0 and approver.returncode == 0, admin.stderr + approver.stderr
        tested = _run(
            [npm, "test"],
            timeout=300,
            NODE_OPTIONS="--test-reporter=tap",
            AGENTRUN_HTTP_URL=dev.http_url,
            AGENTRUN_API_KEY=admin.stdout.strip(),
            AGENTRUN_APPROVER_KEY=approver.stdout.strip(),
            AGENTRUN_WORKSPACE="default",
        )
    shown = _shown(tested)
    assert tested.returncode == 0, shown
    passed = re.findall(r"^ok \d+ - (.+)$", tested.stdout, re.M)
    print(
        "\n".join(["node:test passed:", *passed, *re.findall(r"^# \w+ \d.*$", tested.stdout, re.M)])
    )
    for name in MUST_PASS:
        assert any(p.startswith(name) for p in passed), f"not passed: {name}\n{shown}"
    assert not re.search(r"^not ok ", tested.stdout, re.M), shown
    assert re.search(r"^# fail 0$", tested.stdout, re.M), shown
