"""Child processes for benchmarks: start with a log and a port file, wait, always stop."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

STOP_TIMEOUT = 10.0


class ProcessFailed(RuntimeError):
    """A child exited before it was ready; the message carries its log tail."""


class Proc:
    """One child process, its log file and (optionally) the file it writes its port to."""

    def __init__(
        self, name: str, argv: list[str], env: dict[str, str], workdir: Path, cwd: Path | None
    ) -> None:
        self.name = name
        self.log_path = workdir / f"{name}.log"
        self.port_file = workdir / f"{name}.port"
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                argv,
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a terminal's Ctrl-C reaches only us; we stop it
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def log_lines(self, *markers: str) -> list[str]:
        """The log lines that contain any of `markers` (e.g. '"level": "warning"')."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if any(m in line for m in markers)]

    def log_contains(self, text: str) -> bool:
        try:
            return text in self.log_path.read_text(errors="replace")
        except OSError:
            return False

    def check_alive(self) -> None:
        if not self.alive():
            raise ProcessFailed(
                f"{self.name} exited with {self.popen.returncode}:\n{self.log_tail()}"
            )

    async def wait_port(self, within: float = 30.0) -> int:
        """The port the child wrote to its port file, once it is there."""
        await self._until(self.port_file.exists, within, "wrote no port")
        return int(self.port_file.read_text().strip())

    async def wait_log(self, text: str, within: float = 30.0, watch: Proc | None = None) -> None:
        """Return once the child's log contains `text` (failing early if `watch` dies)."""
        condition = functools.partial(self.log_contains, text)
        await self._until(condition, within, f"did not log {text!r}", watch)

    async def _until(
        self, condition: Callable[[], bool], within: float, failure: str, watch: Proc | None = None
    ) -> None:
        deadline = time.monotonic() + within
        while not condition():
            self.check_alive()
            if watch is not None:
                watch.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} {failure} within {within:.0f}s")
            await asyncio.sleep(0.05)

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM, then SIGKILL at the deadline; returns once the child is reaped."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                self.popen.wait()


class Procs:
    """The children of one benchmark, stopped in reverse order on exit, even on error."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._procs: list[Proc] = []

    def start(
        self, name: str, argv: list[str], env: dict[str, str], cwd: Path | None = None
    ) -> Proc:
        proc = Proc(name, argv, env, self.workdir, cwd)
        self._procs.append(proc)
        return proc

    def stop(self, proc: Proc) -> None:
        proc.stop()
        self._procs.remove(proc)

    def stop_all(self) -> None:
        while self._procs:
            self._procs.pop().stop()

    def __enter__(self) -> Procs:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop_all()


@contextlib.contextmanager
def workdir(name: str) -> Iterator[Path]:
    """A directory for children's logs and port files; kept (and named) if the body fails."""
    path = Path(tempfile.mkdtemp(prefix=f"agentrun-bench-{name}-"))
    keep = False
    try:
        yield path
    except Exception:
        keep = True
        print(f"   (process logs kept in {path})", file=sys.stderr, flush=True)
        raise
    finally:
        if not keep:  # an interrupt is no failure worth the logs
            shutil.rmtree(path, ignore_errors=True)
