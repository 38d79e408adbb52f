"""The README works as written: every shell block of README.md and docs/*.md runs, in order,
against a running `agentrun dev`, and exits 0.

A block opts out with ```sh no-test, or an HTML comment `<!-- no-test: why -->` on the
line before its fence: for the blocks that are the test suite itself (`make test`), that
run for ever (`agentrun dev`) or that need what a laptop does not have (certificates).

The one liberty taken: the stack listens where it can (another `agentrun dev` may hold
50051 and 8080 on this machine), so `127.0.0.1:50051` and `127.0.0.1:8080` in a block
are replaced by the addresses it printed, the way a reader would use what it printed.
The CLI finds the stack's data directory (its credentials) through AGENTRUN_DATA_DIR, as
a shell that ran `agentrun dev --data-dir D` with AGENTRUN_DATA_DIR=D would.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness.agentrun_dev import REPO, DevProcess, running_dev
from tests.harness.servers import scratch_dir

SHELLS = {"sh", "bash", "shell"}
_FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S
)
_NO_TEST_COMMENT = re.compile(r"<!--\s*no-test\b[^>]*-->\s*$")
# What some blocks must print (a block is named by its file and first line).
EXPECTED = {
    "S=http://127.0.0.1:8080/v1/workspaces/default/streams/notes/today": [
        "201 created\n200\n200\n204\n",
        '[{"note":0},{"note":1}]',
        "204 closed",
        "204 deleted",
    ],
    "FEED=http://127.0.0.1:8080/v1/workspaces/default/streams/_agentrun/feed": [
        '"kind":"finish"',
        '"streamClosed":true',
        "'run.state'",
    ],
    "agents create triage": ["created agent triage", "published triage v1", "status: completed"],
    "agentrun events publish invoice.paid --id doc-inv-1": [
        "event invoice.paid doc-inv-1: woke 0 run(s), cancelled 0",
        "event invoice.paid doc-inv-1: already published (nothing woken again)",
        '"created":true',
    ],
    "export AGENTRUN_API_KEY=$(.venv/bin/agentrun dev-key)": [
        "SERVING",
        "agentrun.v1.RunService",
        "RUN_STATUS_COMPLETED",
    ],
    "RUN=$(.venv/bin/agentrun runs start triage": [
        "status: waiting (approval)",
        "approved by",
        "status: completed",
        "status: cancelled",
    ],
    "agents apply -f examples/triage.yaml": ["published triage v2", "nothing published"],
    ".venv/bin/python examples/python_quickstart.py": [
        "approval_requested",
        "send_email to ada@example.com: approved",
        "completed: ",
    ],
    "PROVIDERS=http://127.0.0.1": [
        "created tool channel_history v1",
        "nothing saved",
        "published reader v1",
        "status: completed",
    ],
    "port=$(mktemp)": [
        "saved desk__add_note v1  write (provider_key), key in idempotency_key",
        "pending + desk__create_ticket  write, proposed none: needs --class",
        "nothing saved: apply exactly this diff with agentrun tools sync desk --apply --expect ",
        "saved desk__create_ticket v1  write (none)",
    ],
    "API=http://127.0.0.1:8080/v1/workspaces/default": [
        "event: step",
        "event: end",
        '"status": "completed"',
        '"field":"priority"',
        "/v1/openapi.json",
    ],
    # docs/triggers.md, "Private sessions": hidden from a non-member until added.
    "SESSIONS=http://127.0.0.1:8080/v1/workspaces/default/sessions": [
        "approver before: 404",
        '"visibility":"private"',
        '"key:manager@example.com"',
        "approver after: 200",
    ],
    'export PATH="$PWD/.venv/bin:$PATH"': [
        "published forecaster v1",
        "weather ok",
        "Weather report: ",
        "published forecaster v2",
        "Today in Lisbon: ",
    ],
    "the sandbox's sleepy model sleeps 2 s": [
        "published keyed v1",
        "status: waiting (concurrency_key) for a slot of key 'c-17'",
        "status: completed",
    ],
    "SHOP=http://127.0.0.1": [
        "write (provider_key, Idempotency-Key)",
        "dry run: nothing saved",
        "published orderer v1",
        "status: completed",
    ],
}


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    info: str
    body: str
    skip: bool

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def shell_blocks(path: Path) -> list[Block]:
    text = path.read_text()
    found = []
    for m in _FENCE.finditer(text):
        words = m.group("info").split()
        if not words or words[0] not in SHELLS:
            continue
        line = text.count("\n", 0, m.start()) + 1
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = "no-test" in words[1:] or bool(_NO_TEST_COMMENT.search(before))
        found.append(Block(path, line, m.group("info"), m.group("body"), skip))
    return found


def all_blocks() -> list[Block]:
    paths = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    return [b for p in paths for b in shell_blocks(p)]


BLOCKS = all_blocks()


def test_the_documents_have_blocks_to_run_and_skip_few() -> None:
    runnable = [b for b in BLOCKS if not b.skip]
    assert len(runnable) >= 5
    assert len(runnable) >= 2 * (len(BLOCKS) - len(runnable)), "no-test is for the exceptions"


@pytest.fixture(scope="module")
def dev() -> Iterator[DevProcess]:
    with (
        scratch_dir("agentrun-readme-") as data_dir,
        running_dev(data_dir, "--address", "127.0.0.1:0") as dev,
    ):
        yield dev


def _as_run_here(body: str, dev: DevProcess) -> str:
    http = dev.http_url.removeprefix("http://")
    return body.replace("127.0.0.1:50051", dev.address).replace("127.0.0.1:8080", http)


# A block that starts a stack of its own (README "Your own agent") needs longer than the rest.
TIMEOUTS = {'export PATH="$PWD/.venv/bin:$PATH"': 240}


def _env(dev: DevProcess) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    tmp = dev.data_dir / "tmp"  # mktemp -d in a block: removed with the stack's data dir
    tmp.mkdir(exist_ok=True)
    return {
        **dev.cli_env(),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "AGENTRUN_CONFIG": str(dev.data_dir / "cli-config.toml"),  # profiles, not ~/.config
        "NO_COLOR": "1",
        "TMPDIR": str(tmp),
    }


@pytest.mark.parametrize("block", [b for b in BLOCKS if not b.skip], ids=lambda b: b.name)
def test_block_runs_as_written(block: Block, dev: DevProcess) -> None:
    script = _as_run_here(block.body, dev)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=REPO,
        env=_env(dev),
        capture_output=True,
        text=True,
        timeout=max([90, *(t for key, t in TIMEOUTS.items() if key in block.body)]),
    )
    shown = f"--- {block.name}\n{script}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    assert done.returncode == 0, shown
    assert "Traceback" not in done.stderr, shown
    first = block.body.strip().splitlines()[0]
    for key, wanted in EXPECTED.items():
        if key in first:
            for text in wanted:
                assert text in done.stdout + done.stderr, shown
