"""`agentrun dev` tells the truth about where it listens, and Ctrl-C leaves nothing behind."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agentrun_cli.devstack import EmbeddedRedis
from tests.harness.agentrun_dev import AGENTRUN, alive, running_dev
from tests.harness.servers import scratch_dir
from tests.harness.waiting import eventually_sync


@pytest.fixture
def data_dir() -> Iterator[Path]:
    with scratch_dir("agentrun-dev-test-") as path:
        yield path


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port something else listens on (as 8080 often is)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_taken_http_port_moves_and_links_name_the_port_really_bound(
    data_dir: Path, db_url: str, redis_server: EmbeddedRedis, taken_port: int
) -> None:
    with running_dev(
        data_dir,
        "--address",
        "127.0.0.1:0",
        DATABASE_URL=db_url,
        REDIS_URL=redis_server.url,
        AGENTRUN_HTTP_LISTEN=f"127.0.0.1:{taken_port}",
    ) as dev:
        assert f"port {taken_port} is taken" in dev.output()
        assert dev.http_url and dev.http_url != f"http://127.0.0.1:{taken_port}"
        # A CLI told nothing of the address dials the port this stack really bound.
        found = subprocess.run(
            [AGENTRUN, "agents", "list", "-o", "json"],
            env={k: v for k, v in dev.cli_env().items() if k != "AGENTRUN_ADDRESS"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert found.returncode == 0 and json.loads(found.stdout) == [], found.stderr
        assert httpx.get(f"{dev.http_url}/healthz", timeout=5).status_code == 200
        for argv in (
            ("agents", "create", "triage"),
            ("agents", "publish", "triage", "--model", "demo", "--tool", "crm_lookup"),
        ):
            assert dev.cli(*argv).returncode == 0
        made = dev.cli(
            "triggers", "create", "paid", "--agent", "triage", "--webhook", "stripe", "-o", "json"
        )
        assert made.returncode == 0, made.stderr
        url = json.loads(made.stdout)["trigger"]["url"]
        assert url == f"{dev.http_url}/hooks/default/paid"
        # The ingress answers there: an unsigned delivery is refused, not unroutable.
        assert httpx.post(url, content=b"{}", timeout=5).status_code in (400, 401)


def test_ctrl_c_stops_every_child_even_when_stdout_is_a_closed_pipe(data_dir: Path) -> None:
    # Embedded Postgres and Redis too: the whole stack as `agentrun dev | tee log` runs it.
    with running_dev(data_dir, "--address", "127.0.0.1:0") as dev:
        children = dev.descendants()
        names = {Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] for pid in children}
        assert any(n.endswith(b"postgres") for n in names), names
        assert len(children) >= 7  # postgres, redis, 3 sandboxes, control plane, executor
        # Ctrl-C reaches the whole foreground group, so `cat` dies with agentrun: the pipe is
        # closed when agentrun prints "interrupted" and "stopping".
        code = dev.interrupt(timeout=90)
        assert dev.tee.wait(10) != 0  # cat was interrupted, not at the end of its input
        eventually_sync(lambda: not alive(children), timeout=10, message="children gone")
        assert code == 0
    # Stopped, it leaves no address behind for a CLI to dial.
    assert not (data_dir / "run" / "control-plane.port").exists()
