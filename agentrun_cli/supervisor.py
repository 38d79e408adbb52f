"""Child process supervision for `agentrun dev`: start, wait for a port file, watch, stop."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

POLL = 0.05


class StackError(RuntimeError):
    """A child could not start, or died while the stack was up."""


@dataclass
class Child:
    """One supervised process; its stdout and stderr go to `log_path`."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    log_offset: int
    port_file: Path | None = None
    port: int | None = None
    expected_exit: bool = field(default=False, repr=False)

    def tail(self, lines: int = 20) -> str:
        """The last lines this process wrote (this start only, not earlier runs' logs)."""
        with self.log_path.open("rb") as f:
            f.seek(self.log_offset)
            text = f.read().decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])

    def describe_exit(self) -> str:
        return f"{self.name} exited with code {self.proc.returncode} (log {self.log_path}):\n" + (
            self.tail() or "(no output)"
        )


class Supervisor:
    """Starts children in order and stops them in reverse: SIGTERM, then SIGKILL after `grace`.

    A child that exits before `stop_all()` is a failure: it is recorded in
    `failure`, `failed` is set and every `on_exit` callback runs (on a watcher
    thread), so a caller blocked elsewhere can give up at once.
    """

    def __init__(self, log_dir: Path, grace: float = 10.0) -> None:
        self.log_dir = log_dir
        self.grace = grace
        self.children: list[Child] = []
        self.failed = threading.Event()
        self.failure: Child | None = None
        self._callbacks: list[Callable[[Child], None]] = []
        self._stopping = False

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop_all()

    def start(
        self,
        name: str,
        argv: Sequence[str],
        env: dict[str, str] | None = None,
        port_file: Path | None = None,
    ) -> Child:
        """Start `argv` with its output appended to `<log_dir>/<name>.log`."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        if port_file is not None:
            port_file.unlink(missing_ok=True)  # a stale file would look like readiness
        with log_path.open("ab") as log:
            offset = log.tell()
            log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv)}\n".encode())
            log.flush()
            # Own session: Ctrl-C in the terminal reaches only us, and we stop the
            # children in order (the executor first, so it can hand its runs back).
            proc = subprocess.Popen(
                list(argv),
                env={**os.environ, **(env or {})},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        child = Child(name, proc, log_path, offset, port_file)
        self.children.append(child)
        threading.Thread(
            target=self._watch, args=(child,), name=f"watch-{name}", daemon=True
        ).start()
        return child

    def wait_port(self, child: Child, timeout: float) -> int:
        """Wait until the child writes its port file; StackError if it exits or times out."""
        assert child.port_file is not None, f"{child.name} has no port file"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            port = _read_port(child.port_file)
            if port is not None and _accepts(port):
                child.port = port
                return port
            if child.proc.poll() is not None:
                raise StackError(child.describe_exit())
            time.sleep(POLL)
        raise StackError(
            f"{child.name} wrote no port file ({child.port_file}) within {timeout:g}s; "
            f"log {child.log_path}:\n{child.tail()}"
        )

    def on_exit(self, callback: Callable[[Child], None]) -> None:
        """Run `callback(child)` when a child exits unexpectedly (at once if one already has)."""
        self._callbacks.append(callback)
        if self.failure is not None:
            callback(self.failure)

    def _watch(self, child: Child) -> None:
        child.proc.wait()
        if self._stopping or child.expected_exit:
            return
        if self.failure is None:
            self.failure = child
        self.failed.set()
        for callback in list(self._callbacks):
            callback(child)

    def stop_all(self) -> None:
        """Stop every child, newest first; each gets `grace` seconds after SIGTERM."""
        self._stopping = True
        for child in reversed(self.children):
            self._stop(child)

    def kill_all(self) -> None:
        """SIGKILL every child still running (an impatient second Ctrl-C)."""
        self._stopping = True
        for child in self.children:
            child.expected_exit = True
            if child.proc.poll() is None:
                _signal_group(child.proc, signal.SIGKILL)

    def _stop(self, child: Child) -> None:
        child.expected_exit = True
        if child.proc.poll() is not None:
            return
        _signal_group(child.proc, signal.SIGTERM)
        try:
            child.proc.wait(timeout=self.grace)
        except subprocess.TimeoutExpired:
            _signal_group(child.proc, signal.SIGKILL)
            child.proc.wait()


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    # The child leads its own process group (start_new_session), so this also
    # reaches anything it started.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _read_port(path: Path) -> int | None:
    """The port in a port file (`1234` or `host:1234`), None while it is absent or partial."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    try:
        return int(text.rsplit(":", 1)[-1])
    except ValueError:
        return None


def _accepts(port: int) -> bool:
    """True when something accepts TCP connections on 127.0.0.1:port (guards a half-written file)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False
