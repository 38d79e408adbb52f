"""The local stack of `agentrun dev`: stores, sandboxes, control plane and an executor as processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import grpc

from agentrun_cli.supervisor import Child, StackError, Supervisor

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PORT = 50051
# The HTTP ingress (webhooks, sessions, approval links); a free port when it is taken.
DEFAULT_HTTP_PORT = 8080
STARTUP_TIMEOUT = 60.0
# The model profiles the dev stack's executor knows (executor/models/profiles.py).
SANDBOX_OPENAI = "sandbox-openai"
SANDBOX_ANTHROPIC = "sandbox-anthropic"


def default_data_dir() -> Path:
    """`$AGENTRUN_DATA_DIR`, else `<repo>/.data`."""
    return Path(os.environ.get("AGENTRUN_DATA_DIR") or REPO / ".data")


def database_url(data_dir: Path) -> str:
    """DATABASE_URL, else an embedded Postgres under `data_dir` (started or reused)."""
    return _store_url("database", data_dir)


def redis_url(data_dir: Path) -> str:
    """REDIS_URL, else an embedded Redis under `data_dir` (started or reused)."""
    return _store_url("redis", data_dir)


def _store_url(kind: str, data_dir: Path) -> str:
    # Imported here: only the commands that run a local stack need it.
    from agentrun_cli import devstack

    try:
        return getattr(devstack, f"{kind}_url")(data_dir)
    except (devstack.ServerStartError, TimeoutError) as err:
        raise StackError(f"embedded {kind} did not start: {err}") from err


def migrate(url: str, *, citus: bool = False) -> list[str]:
    """Apply every pending migration to the database at `url`; with `citus`, then place
    its tables on the Citus cluster and return the tables placed now."""
    from control_plane.store import citus as citus_plan
    from control_plane.store import migrate as migrations

    if not citus:
        asyncio.run(migrations.migrate_url(url))
        return []
    try:
        return asyncio.run(citus_plan.migrate_and_distribute(url))
    except citus_plan.CitusError as err:
        raise StackError(str(err)) from err


def citus_summary(placed: list[str]) -> str:
    """What `migrate --citus` did, in one line."""
    from control_plane.store import citus as citus_plan

    if not placed:
        return "workspace_id: every table was already placed"
    return (
        f"{citus_plan.DISTRIBUTION_COLUMN}; placed {len(placed)} table(s) now ({', '.join(placed)})"
    )


CREDENTIALS = "credentials.json"
# Where `agentrun dev` records the gRPC port its control plane bound (AGENTRUN_PORT_FILE): a
# second checkout's stack moves off a taken 50051, and its CLI must follow it there.
CONTROL_PLANE_PORT_FILE = Path("run") / "control-plane.port"


def recorded_address(data_dir: Path | None = None) -> tuple[str, Path] | None:
    """The gRPC address the dev stack of `data_dir` (default: this checkout's) bound, and the
    file that says so; None when no stack of that data dir is up (it removes the file).
    agentrun_client finds a dev stack the same way."""
    from agentrun_client.config import recorded_address as found

    return found(data_dir or default_data_dir())


def dev_credentials(url: str, data_dir: Path) -> str:
    """Bootstrap (or reuse) the dev workspace's keys in `data_dir`; the executor's key."""
    from control_plane.auth.bootstrap import ensure_dev_credentials

    workspace = os.environ.get("AGENTRUN_WORKSPACE") or "default"
    creds = asyncio.run(ensure_dev_credentials(url, data_dir / CREDENTIALS, workspace))
    return creds.executor_key


def redact(url: str) -> str:
    """`postgresql://user:secret@host/db` -> `postgresql://user:***@host/db` (for printing)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(":" + parts.password + "@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass
class Endpoints:
    """Where the pieces of a running stack listen."""

    database_url: str
    redis_url: str
    model_url: str
    providers_url: str
    idp_url: str
    control_plane: str
    executor_pid: int
    log_dir: Path
    console_url: str = ""  # the web console on the HTTP ingress
    model: str = ""
    """Which model serves the agents that name no model_profile, when not the sandbox."""
    http_url: str = ""
    """The HTTP ingress as bound (webhooks, approval links, sessions)."""

    def lines(self) -> list[str]:
        console = [f"  web console    {self.console_url}"] if self.console_url else []
        return [
            f"  postgres       {redact(self.database_url)}",
            f"  redis          {redact(self.redis_url)}",
            f"  model sandbox  {self.model_url}",
            *([f"  model          {self.model}"] if self.model else []),
            f"  providers      {self.providers_url}",
            f'  sign-in (OIDC) {self.idp_url}  (POST /token {{"email": ...}} for an ID token)',
            f"  control plane  {self.control_plane} (gRPC)",
            f"  http           {self.http_url}  (webhooks {self.http_url}/hooks/..., approval links)",
            *console,
            f"  executor       pid {self.executor_pid}",
            f"  logs           {self.log_dir}/",
        ]


class DevStack:
    """Brings the stack up in dependency order; the supervisor owns (and stops) the children."""

    def __init__(
        self,
        data_dir: Path,
        supervisor: Supervisor,
        port: int = DEFAULT_PORT,
        timeout: float = STARTUP_TIMEOUT,
        scenarios: Path | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.scenarios = scenarios
        """The user's scenario directory, served before the built-in scenarios."""
        self.supervisor = supervisor
        self.port = port
        self.timeout = timeout
        self.run_dir = data_dir / "run"
        self.embedded: list[str] = []
        """Embedded stores (`postgres`, `redis`) this stack started or adopted; stop() ends them."""

    def stop(self) -> None:
        """Stop the children (newest first), then the embedded stores, so nothing is left behind."""
        self.supervisor.stop_all()
        # No stack, no address: the CLI must not dial a port someone else may have taken.
        (self.data_dir / CONTROL_PLANE_PORT_FILE).unlink(missing_ok=True)
        while self.embedded:
            name = self.embedded.pop()
            try:
                _stop_embedded(self.data_dir, name)
            except (RuntimeError, TimeoutError, OSError) as err:  # report, go on stopping
                with contextlib.suppress(OSError):  # stderr may be a closed pipe by now
                    print(f"warning: embedded {name} did not stop: {err}", file=sys.stderr)

    def _note_embedded(self, name: str, env_var: str) -> None:
        if not os.environ.get(env_var):
            self.embedded.append(name)

    def start(self, say: Callable[[str], None] = print) -> Endpoints:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        say(f"data dir {self.data_dir}; starting Postgres and Redis (embedded unless set in env)")
        db = database_url(self.data_dir)
        self._note_embedded("postgres", "DATABASE_URL")
        redis = redis_url(self.data_dir)
        self._note_embedded("redis", "REDIS_URL")
        migrate(db)
        executor_key = dev_credentials(db, self.data_dir)
        say(f"database migrated; credentials in {self.data_dir / CREDENTIALS}")
        say("starting sandboxes, control plane and executor")
        model, providers, idp = self._sandboxes()
        control_plane, http_url = self._control_plane(db, providers, idp, say)
        real = real_model(os.environ)
        executor = self._executor(control_plane, model, providers, redis, executor_key, real)
        return Endpoints(
            db,
            redis,
            model,
            providers,
            idp,
            control_plane,
            executor.proc.pid,
            self.supervisor.log_dir,
            http_url=http_url,
            console_url=f"{http_url}/console/",
            model=real.describe() if real else "",
        )

    def _sandboxes(self) -> tuple[str, str, str]:
        # All start at once; then wait for each (they do not depend on each other).
        children = [self._sandbox(which) for which in ("model", "providers", "idp")]
        model, providers, idp = (self.supervisor.wait_port(c, self.timeout) for c in children)
        return (
            f"http://127.0.0.1:{model}/v1",
            f"http://127.0.0.1:{providers}",
            f"http://127.0.0.1:{idp}",
        )

    def _control_plane(
        self, db: str, providers: str, idp: str, say: Callable[[str], None]
    ) -> tuple[str, str]:
        """Start it; its gRPC address and the HTTP ingress's URL, both as bound."""
        port = self.port if _port_free(self.port) else 0  # busy: let the server pick one
        http_port = _http_port(say)
        port_file = self._port_file("control-plane")
        http_port_file = self._port_file("control-plane-http")
        env = {
            "DATABASE_URL": db,
            "AGENTRUN_LISTEN": f"127.0.0.1:{port}",
            "AGENTRUN_PORT_FILE": str(port_file),
            "AGENTRUN_HTTP_LISTEN": f"127.0.0.1:{http_port}",
            "AGENTRUN_HTTP_PORT_FILE": str(http_port_file),
            # Webhook, approval and reconnect links name the port really bound
            # (unless the environment says where the public address is).
            "AGENTRUN_PUBLIC_URL": os.environ.get("AGENTRUN_PUBLIC_URL")
            or f"http://127.0.0.1:{http_port}",
            # Approval notifications go to the sandbox mail and chat providers.
            "AGENTRUN_NOTIFY_URL": providers,
            # People sign in through the sandbox identity provider.
            "AGENTRUN_OIDC_ISSUER": idp,
        }
        child = self._python("control-plane", ["-m", "control_plane"], env, port_file)
        address = f"127.0.0.1:{self.supervisor.wait_port(child, self.timeout)}"
        self._wait_serving(child, address)
        bound = _read_port_file(http_port_file)
        if bound != http_port:
            raise StackError(f"the HTTP ingress bound port {bound}, not {http_port}")
        return address, f"http://127.0.0.1:{bound}"

    def _executor(
        self,
        control_plane: str,
        model: str,
        providers: str,
        redis: str,
        key: str,
        real: RealModel | None = None,
    ) -> Child:
        # Agents may name either API: both sandbox profiles play the same scenarios.
        profiles = json.loads(sandbox_profiles(model))
        env = {
            "AGENTRUN_EXECUTOR_KEY": key,
            "AGENTRUN_CONTROL_PLANE": control_plane,
            "AGENTRUN_MODEL_BASE_URL": model,
            "AGENTRUN_MODEL_DEFAULT_PROFILE": "",
            "AGENTRUN_PROVIDERS_URL": providers,
            "REDIS_URL": redis,
        }
        if real is not None:  # a provider the user's environment names serves the others
            profiles.update(real.profiles)
            env["AGENTRUN_MODEL_BASE_URL"] = real.base_url or model
            env["AGENTRUN_MODEL_DEFAULT_PROFILE"] = real.default_profile
        env["AGENTRUN_MODEL_PROFILES"] = json.dumps(profiles)
        return self._python("executor", ["-m", "executor"], env=env)

    def _sandbox(self, which: str) -> Child:
        port_file = self._port_file(which)
        argv = ["-m", "sandbox", which, "--port", "0", "--port-file", str(port_file)]
        if which == "model" and self.scenarios is not None:
            from sandbox.scenario import DEFAULT_DIR

            argv += ["--scenarios", str(self.scenarios), "--scenarios", str(DEFAULT_DIR)]
        return self._python(which, argv, port_file=port_file)

    def _python(
        self,
        name: str,
        args: list[str],
        env: dict[str, str] | None = None,
        port_file: Path | None = None,
    ) -> Child:
        env = {"PYTHONUNBUFFERED": "1", **(env or {})}
        return self.supervisor.start(name, [sys.executable, *args], env, port_file)

    def _port_file(self, name: str) -> Path:
        return self.run_dir / f"{name}.port"

    def _wait_serving(self, child: Child, address: str) -> None:
        """The port file says bound; a connected channel says the gRPC server answers."""
        with grpc.insecure_channel(address) as channel:
            ready = grpc.channel_ready_future(channel)
            deadline = time.monotonic() + self.timeout
            while time.monotonic() < deadline:
                try:
                    ready.result(timeout=0.2)
                    return
                except grpc.FutureTimeoutError:
                    if child.proc.poll() is not None:
                        raise StackError(child.describe_exit()) from None
        raise StackError(f"control plane at {address} is not serving:\n{child.tail()}")


def sandbox_profiles(model_url: str) -> str:
    """AGENTRUN_MODEL_PROFILES for the model sandbox at `model_url` (`…/v1`): the profile
    `sandbox-openai` (chat completions) and `sandbox-anthropic` (Messages API)."""
    base = model_url.rstrip("/").removesuffix("/v1")
    return json.dumps(
        {
            SANDBOX_OPENAI: {"provider": "openai", "base_url": f"{base}/v1"},
            SANDBOX_ANTHROPIC: {"provider": "anthropic", "base_url": base},
        }
    )


OPENAI_URL = "https://api.openai.com/v1"
ANTHROPIC_URL = "https://api.anthropic.com"


@dataclass(frozen=True)
class RealModel:
    """The model provider the user's environment names, for the agents that name no
    model_profile: AGENTRUN_MODEL_BASE_URL (any OpenAI-compatible server, its key in
    AGENTRUN_MODEL_API_KEY), else OPENAI_API_KEY, else ANTHROPIC_API_KEY. Keys stay in the
    environment: the executor reads them by name (api_key_env), nothing here holds one."""

    default_profile: str = ""
    """The profile serving versions that name none; empty: the default endpoint."""
    base_url: str = ""
    """The default endpoint (AGENTRUN_MODEL_BASE_URL), when it is the one."""
    profiles: dict[str, dict[str, str]] = field(default_factory=dict)

    def describe(self) -> str:
        if self.base_url:
            return f"{self.base_url} (AGENTRUN_MODEL_BASE_URL) for agents without model_profile"
        named = self.profiles[self.default_profile]
        return (
            f"{named['base_url']} ({named['api_key_env']}, profile {self.default_profile}) "
            "for agents without model_profile; sandbox-openai plays scenarios"
        )


def real_model(env: Mapping[str, str]) -> RealModel | None:
    """What serves the dev stack's agents when the environment names a provider (None: the
    model sandbox, playing scenario files)."""
    profiles: dict[str, dict[str, str]] = {}
    if env.get("OPENAI_API_KEY"):
        url = env.get("OPENAI_BASE_URL") or OPENAI_URL
        profiles["openai"] = {
            "provider": "openai",
            "base_url": url,
            "api_key_env": "OPENAI_API_KEY",
        }
    if env.get("ANTHROPIC_API_KEY"):
        profiles["anthropic"] = {
            "provider": "anthropic",
            "base_url": env.get("ANTHROPIC_BASE_URL") or ANTHROPIC_URL,
            "api_key_env": "ANTHROPIC_API_KEY",
        }
    if base_url := env.get("AGENTRUN_MODEL_BASE_URL"):
        return RealModel(base_url=base_url, profiles=profiles)
    if profiles:
        return RealModel(default_profile=next(iter(profiles)), profiles=profiles)
    return None


def _http_port(say: Callable[[str], None]) -> int:
    """The port of AGENTRUN_HTTP_LISTEN (default 8080), or a free one when it is taken.

    Chosen here rather than by the server (port 0) so that the public URL the
    control plane puts in links can name it.
    """
    listen = os.environ.get("AGENTRUN_HTTP_LISTEN") or f"127.0.0.1:{DEFAULT_HTTP_PORT}"
    try:
        wanted = int(listen.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        raise StackError(f"AGENTRUN_HTTP_LISTEN={listen!r} is not host:port") from None
    if wanted and _port_free(wanted):
        return wanted
    from agentrun_cli.devstack import free_tcp_port

    port = free_tcp_port()
    if wanted:
        say(f"port {wanted} is taken; the HTTP ingress listens on 127.0.0.1:{port} instead")
    return port


def _read_port_file(path: Path) -> int | None:
    try:
        return int(path.read_text().strip().rsplit(":", 1)[-1])
    except (OSError, ValueError):
        return None


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _stop_embedded(data_dir: Path, name: str) -> None:
    """Stop the server database_url()/redis_url() runs in `data_dir/<name>`."""
    from agentrun_cli import devstack

    server = devstack.EmbeddedPostgres if name == "postgres" else devstack.EmbeddedRedis
    # start() adopts the server already running on that directory; stop() then ends it.
    server(data_dir / name).start().stop()
