"""`agentrun dev` as a user runs it: `agentrun dev | cat`, its output read line by line.

with running_dev(data_dir, DATABASE_URL=db_url) as dev:
    dev.address, dev.http_url      # what it printed as bound
    dev.cli("runs", "list")        # the CLI against it, as a user would call it
    dev.interrupt()                # Ctrl-C
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from agentrun_cli.devstack import process_alive

REPO = Path(__file__).resolve().parents[2]
AGENTRUN = str(Path(sys.executable).parent / "agentrun")
_GRPC = re.compile(r"^\s+control plane\s+(\S+) \(gRPC\)")
_HTTP = re.compile(r"^\s+http\s+(http://\S+)")


# A provider's key or address in the developer's environment makes `agentrun dev` call that
# model (agentrun_cli/stack.py real_model): never in a test that did not ask for it.
MODEL_KEYS = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without the developer's agentrun settings, plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("AGENTRUN_")
        and k not in ("DATABASE_URL", "REDIS_URL", "NO_COLOR", *MODEL_KEYS)
    }
    # The HTTP ingress on a free port unless the test names one: the suite runs files in
    # parallel (pytest-xdist), and two stacks that both find 8080 free race to bind it.
    env["AGENTRUN_HTTP_LISTEN"] = "127.0.0.1:0"
    return {**env, **extra}


@dataclass
class DevProcess:
    proc: subprocess.Popen[str]
    tee: subprocess.Popen[str]
    """`cat`, reading agentrun's stdout: the `| tee log` of a user's terminal."""
    data_dir: Path
    env: dict[str, str]
    lines: list[str] = field(default_factory=list)
    address: str = ""
    http_url: str = ""
    _queue: queue.Queue[str | None] = field(default_factory=queue.Queue)

    def _pump(self) -> None:
        assert self.tee.stdout is not None
        with contextlib.suppress(ValueError, OSError):
            for line in self.tee.stdout:
                self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_up(self, timeout: float) -> None:
        """Read lines until the `try:` line that follows the endpoints; fail on exit."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(
                    f"agentrun dev not up in {timeout}s:\n" + self.output()
                ) from None
            if line is None:
                raise AssertionError("agentrun dev exited:\n" + self.output())
            self.lines.append(line)
            if m := _GRPC.match(line):
                self.address = m.group(1)
            if m := _HTTP.match(line):
                self.http_url = m.group(1)
            if line.startswith("try:"):
                return

    def wait_line(self, text: str, timeout: float = 30) -> str:
        """Read lines until one holds `text` (the ones read before it stay in `lines`)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(
                    f"no line with {text!r} in {timeout}s:\n{self.output()}"
                ) from None
            if line is None:
                raise AssertionError("agentrun dev exited:\n" + self.output())
            self.lines.append(line)
            if text in line:
                return line

    def output(self) -> str:
        return "\n".join(self.lines)

    def cli_env(self) -> dict[str, str]:
        """What a user's shell has once `agentrun dev` runs: the CLI finds it by these."""
        return {
            **self.env,
            "AGENTRUN_ADDRESS": self.address,
            "AGENTRUN_DATA_DIR": str(self.data_dir),
        }

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [AGENTRUN, *args],
            env=self.cli_env(),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def descendants(self) -> list[int]:
        """Every process below `agentrun dev` right now (children, their children...)."""
        found, frontier = [], [self.proc.pid]
        while frontier:
            parent = frontier.pop()
            kids = _children(parent)
            found += kids
            frontier += kids
        return found

    def interrupt(self, timeout: float = 60) -> int:
        """Ctrl-C: SIGINT to the foreground group (`cat` first, so the pipe closes as agentrun
        starts stopping, as in a terminal); agentrun's exit code."""
        self.tee.send_signal(signal.SIGINT)
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout)


AS_IN_A_TERMINAL = ["env", "--default-signal=INT"]
"""Ctrl-C's default action, as in a terminal's foreground group: a suite started in the
background by a non-interactive shell (`make test &`) has SIGINT ignored, and children inherit
that, so `cat` would outlive the Ctrl-C this harness sends.

Not `preexec_fn`: that makes Python fork() where it would vfork(). A fork() while this
process's gRPC channels were busy, with gRPC's fork support on, crashed the child before its
exec (grpc/grpc#43055); telemetry/grpc_core.py now turns that support off, and a vfork()
never runs gRPC's fork handlers at all."""


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[1] == str(pid):
            out.append(int(stat.parent.name))
    return out


def alive(pids: list[int]) -> list[int]:
    return [p for p in pids if process_alive(p)]


@contextlib.contextmanager
def running_dev(
    data_dir: Path, *args: str, timeout: float = 120, **env: str
) -> Iterator[DevProcess]:
    """Start `agentrun dev --data-dir data_dir ARGS` (stdout a pipe); stop it, and every process
    it left, afterwards."""
    full_env = clean_env(PYTHONUNBUFFERED="1", **env)
    argv = [*AS_IN_A_TERMINAL, AGENTRUN, "dev", "--data-dir", str(data_dir), *args]
    proc = subprocess.Popen(
        argv,
        env=full_env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    tee = subprocess.Popen(
        [*AS_IN_A_TERMINAL, "cat"],
        stdin=proc.stdout,
        stdout=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()  # only `cat` reads agentrun's output now
    dev = DevProcess(proc, tee, data_dir, full_env)
    threading.Thread(target=dev._pump, daemon=True).start()
    seen: list[int] = []
    try:
        dev.wait_up(timeout)
        seen = dev.descendants()
        yield dev
    finally:
        if proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                dev.interrupt(60)
        for pid in alive(seen):  # only if the stack failed to stop them (the test says so)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
        if tee.poll() is None:
            tee.kill()
        tee.wait()
