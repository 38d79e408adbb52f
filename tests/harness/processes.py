"""The project's real processes (control plane, executors, sandboxes) run as test subprocesses.

A server announces readiness by writing its TCP port to a port file once it serves (it is
started on port 0, so the file is the only way to learn the port). Every process logs stdout
and stderr to one file; the tail goes into the failure report of the test that started it.
Every process runs in a session of its own, so `kill()` takes down anything it spawned.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

from agentrun_cli.devstack import log_tail, wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
READY_TIMEOUT = 30.0
EXIT_TIMEOUT = 10.0

# Short lease and heartbeat so that lost-lease takeovers happen within a test's patience.
CONTROL_PLANE_TEST_ENV = {
    "AGENTRUN_LEASE_SECONDS": "3",
    "AGENTRUN_HEARTBEAT_SECONDS": "1",
    "AGENTRUN_CLAIM_POLL_SECONDS": "0.1",
}
EXECUTOR_TEST_ENV = {"AGENTRUN_CAPACITY": "4", "AGENTRUN_MODEL_API_KEY": "sandbox-key"}


class ProcessFailed(RuntimeError):
    """A managed process exited (or never got ready) when it should be serving."""


def _inherited_env() -> dict[str, str]:
    # The developer's own settings must not leak into the processes under test.
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("AGENTRUN_") and key not in ("DATABASE_URL", "REDIS_URL")
    }


def python_module(module: str, *args: str) -> list[str]:
    """argv running `python -m module args…` with this interpreter."""
    return [sys.executable, "-m", module, *args]


class ManagedProcess:
    """One subprocess: start, readiness through its port file, signals, logs."""

    def __init__(
        self,
        argv: list[str],
        env: Mapping[str, object] | None = None,
        *,
        name: str,
        log_path: Path,
        port_file: Path | None = None,
        cwd: Path = REPO_ROOT,
    ) -> None:
        self.argv = list(argv)
        self.env = {key: str(value) for key, value in (env or {}).items()}
        self.name = name
        self.log_path = log_path
        self.port_file = port_file
        self.cwd = cwd
        self._popen: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"ManagedProcess({self.name!r}, pid={self.pid}, returncode={self.returncode})"

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    @property
    def alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self._popen.poll() if self._popen is not None else None

    @property
    def port(self) -> int:
        """The port the process wrote to its port file."""
        port = self._read_port()
        if port is None:
            raise ProcessFailed(f"{self.name} has not written its port file {self.port_file}")
        return port

    def start(self) -> ManagedProcess:
        """Launch the process (a stale port file is removed first); does not wait."""
        if self.alive:
            raise RuntimeError(f"{self.name} is already running")
        if self.port_file is not None:
            self.port_file.unlink(missing_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"----- {time.strftime('%H:%M:%S')} start {self.argv}\n".encode())
            log.flush()
            self._popen = subprocess.Popen(
                self.argv,
                env={**_inherited_env(), "PYTHONUNBUFFERED": "1", **self.env},
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _live.add(self)
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> ManagedProcess:
        """Wait until the port file holds a port (or, without one, check the process runs)."""
        if self.port_file is None:
            self._check_alive()
            return self

        def has_port() -> bool:
            self._check_alive()
            return self._read_port() is not None

        try:
            wait_until(has_port, timeout, f"{self.name} (port file {self.port_file})")
        except TimeoutError as exc:
            raise ProcessFailed(f"{exc}; log tail:\n{self.log_tail()}") from None
        return self

    def kill(self) -> None:
        """SIGKILL the process (and its group) and reap it: a crash, no cleanup."""
        if self.alive:
            assert self._popen is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._popen.pid, signal.SIGKILL)
            self._popen.wait(EXIT_TIMEOUT)
        _live.discard(self)

    def terminate(self, timeout: float = EXIT_TIMEOUT) -> int | None:
        """SIGTERM (a graceful shutdown); SIGKILL if it has not exited by the deadline."""
        if self.alive:
            assert self._popen is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._popen.pid, signal.SIGTERM)
                os.kill(self._popen.pid, signal.SIGCONT)  # a stopped process must see it
            try:
                self._popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        _live.discard(self)
        return self.returncode

    def stop(self) -> None:
        """SIGSTOP: freeze the process (a long GC pause, a partitioned host) until cont()."""
        self._signal(signal.SIGSTOP)

    def cont(self) -> None:
        """SIGCONT: resume a process frozen by stop()."""
        self._signal(signal.SIGCONT)

    def wait(self, timeout: float | None = EXIT_TIMEOUT) -> int:
        """Wait for the process to exit on its own; return its exit code."""
        if self._popen is None:
            raise RuntimeError(f"{self.name} was never started")
        code = self._popen.wait(timeout)
        _live.discard(self)
        return code

    def restart(self, timeout: float = READY_TIMEOUT, **env: object) -> ManagedProcess:
        """Terminate if running, then start again (with `env` merged in) and wait until ready."""
        self.terminate()
        self.env.update({key: str(value) for key, value in env.items()})
        return self.start().wait_ready(timeout)

    def log_tail(self, lines: int = 60) -> str:
        return log_tail(self.log_path, lines)

    def _signal(self, signum: int) -> None:
        if not self.alive:
            raise ProcessFailed(f"{self.name} is not running")
        assert self._popen is not None
        os.kill(self._popen.pid, signum)

    def _check_alive(self) -> None:
        if not self.alive:
            raise ProcessFailed(
                f"{self.name} exited with code {self.returncode}; log tail:\n{self.log_tail()}"
            )

    def _read_port(self) -> int | None:
        if self.port_file is None:
            return None
        try:
            text = self.port_file.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None


# Every process still running, killed when the interpreter exits however the tests ended.
_live: set[ManagedProcess] = set()


@atexit.register
def _kill_leftovers() -> None:
    for process in list(_live):
        with contextlib.suppress(Exception):
            process.kill()


class ProcessGroup:
    """The processes one test (or the session) started: all killed together at teardown."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.processes: list[ManagedProcess] = []
        self._serial = itertools.count(1)

    def new(
        self, name: str, argv: list[str], env: Mapping[str, object], *, port_file: bool
    ) -> ManagedProcess:
        """A process (not started yet) whose log and port file live in this group's dir."""
        unique = f"{name}-{next(self._serial)}"
        process = ManagedProcess(
            argv,
            env,
            name=name,
            log_path=self.log_dir / f"{unique}.log",
            port_file=self.log_dir / f"{unique}.port" if port_file else None,
        )
        self.processes.append(process)
        return process

    def kill_all(self) -> None:
        for process in self.processes:
            process.kill()

    def log_tails(self, lines: int = 40) -> str:
        """The tail of every process's log, for a failure report."""
        return "\n\n".join(
            f"===== {p.name} (pid {p.pid}, exit {p.returncode}) {p.log_path}\n{p.log_tail(lines)}"
            for p in self.processes
        )


class ControlPlane:
    """A running control plane replica; restart() comes back on the same ports."""

    def __init__(
        self, process: ManagedProcess, http_port_file: Path | None = None, database_url: str = ""
    ) -> None:
        self.process = process
        self.database_url = database_url
        self.port = process.port
        # Written before the gRPC port file, so it is there once the process is ready.
        self.http_port = int(http_port_file.read_text().strip()) if http_port_file else 0

    def __repr__(self) -> str:
        return f"ControlPlane({self.address}, pid={self.process.pid})"

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def http_url(self) -> str:
        """Base URL of the HTTP ingress (webhooks, sessions)."""
        return f"http://{HOST}:{self.http_port}"

    def kill(self) -> None:
        self.process.kill()

    def terminate(self) -> int | None:
        return self.process.terminate()

    def restart(self, timeout: float = READY_TIMEOUT, **env: object) -> ControlPlane:
        """Start again on the same port (executors reconnect to the address they know)."""
        self.process.restart(
            timeout,
            AGENTRUN_LISTEN=self.address,
            AGENTRUN_HTTP_LISTEN=f"{HOST}:{self.http_port}",
            **env,
        )
        return self


def start_control_plane(group: ProcessGroup, database_url: str, **env: object) -> ControlPlane:
    """Start `python -m control_plane` on port 0 against database_url; wait until it serves."""
    settings: dict[str, object] = {
        **CONTROL_PLANE_TEST_ENV,
        "DATABASE_URL": database_url,
        "AGENTRUN_LISTEN": f"{HOST}:0",
        **env,
    }
    settings.setdefault("AGENTRUN_HTTP_LISTEN", f"{HOST}:0")
    process = group.new("control-plane", python_module("control_plane"), settings, port_file=True)
    assert process.port_file is not None
    http_port_file = process.port_file.with_suffix(".http-port")
    process.env["AGENTRUN_PORT_FILE"] = str(process.port_file)
    process.env["AGENTRUN_HTTP_PORT_FILE"] = str(http_port_file)
    return ControlPlane(process.start().wait_ready(), http_port_file, database_url)


def start_executor(
    group: ProcessGroup, control_plane_address: str, executor_id: str, **env: object
) -> ManagedProcess:
    """Start `python -m executor` (no port: ready once it runs); env must name the sandboxes."""
    settings = {
        **EXECUTOR_TEST_ENV,
        "AGENTRUN_CONTROL_PLANE": control_plane_address,
        "AGENTRUN_EXECUTOR_ID": executor_id,
        **env,
    }
    process = group.new(executor_id, python_module("executor"), settings, port_file=False)
    return process.start().wait_ready()


class SandboxServer:
    """A running sandbox (the local model server or the tool providers) on 127.0.0.1."""

    def __init__(self, process: ManagedProcess) -> None:
        self.process = process
        self.port = process.port

    def __repr__(self) -> str:
        return f"SandboxServer({self.url}, pid={self.process.pid})"

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def reset(self) -> None:
        """Forget recorded requests and armed faults (DELETE /_sandbox/requests, …/faults)."""
        with httpx.Client(base_url=self.url, timeout=5.0) as client:
            for path in ("/_sandbox/requests", "/_sandbox/faults"):
                client.delete(path).raise_for_status()


def start_sandbox(group: ProcessGroup, kind: str) -> SandboxServer:
    """Start `python -m sandbox <kind> --port 0 --port-file …` and wait until it serves."""
    argv = python_module("sandbox", kind, "--port", "0")
    process = group.new(f"sandbox-{kind}", argv, {}, port_file=True)
    process.argv += ["--port-file", str(process.port_file)]
    return SandboxServer(process.start().wait_ready())
