"""Run the `agentrun` CLI as a user would: a real process, against a real control plane,
with a key and nothing from the test's own AGENTRUN_* environment or config file."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys


def agentrun(
    address: str, key: str, *args: str, workspace: str = "", timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`agentrun --address ADDRESS [--workspace WS] ARGS…` with `key` as AGENTRUN_API_KEY."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRUN_")}
    env.update(AGENTRUN_API_KEY=key, AGENTRUN_CONFIG=os.devnull)
    where = ["--address", address, *(["--workspace", workspace] if workspace else [])]
    done = subprocess.run(
        [sys.executable, "-m", "agentrun_cli", *where, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


async def agentrun_async(
    address: str,
    key: str,
    *args: str,
    workspace: str = "",
    timeout: float = 120,  # noqa: ASYNC109 (the process's, as subprocess.run takes it)
) -> subprocess.CompletedProcess[str]:
    """`agentrun` from a test whose event loop serves the control plane: in a thread."""
    return await asyncio.to_thread(
        agentrun, address, key, *args, workspace=workspace, timeout=timeout
    )
