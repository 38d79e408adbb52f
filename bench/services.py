"""The agentrun processes a benchmark runs against: control plane, sandbox servers, executors."""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.procs import Proc, Procs

REPO = Path(__file__).resolve().parents[1]


def module_available(name: str) -> bool:
    """True when `python -m name` would find the module (without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _env(**extra: str) -> dict[str, str]:
    # Never benchmark with fault points armed.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRUN_FAULTS")}
    env.setdefault("AGENTRUN_LOG_LEVEL", "INFO")
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env


def _python(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def _start(procs: Procs, name: str, argv: list[str], env: dict[str, str]) -> Proc:
    return procs.start(name, argv, env, cwd=REPO)


async def start_control_plane(
    procs: Procs, dsn: str, name: str = "control_plane", **extra_env: str
) -> tuple[Proc, int]:
    """`python -m control_plane` on a free port; returns the process and its port.

    `name` names its log and port file (unique within the benchmark's workdir)."""
    proc = _start(
        procs,
        name,
        _python("control_plane"),
        _env(
            DATABASE_URL=dsn,
            AGENTRUN_LISTEN="127.0.0.1:0",
            AGENTRUN_HTTP_LISTEN="127.0.0.1:0",  # 8080 may be a dev stack's
            AGENTRUN_PORT_FILE=str(procs.workdir / f"{name}.port"),
            AGENTRUN_LOG_LEVEL="INFO",  # e2e waits for its "executor X connected" lines
            **extra_env,
        ),
    )
    return proc, await proc.wait_port()


async def start_sandbox(procs: Procs, server: str, *args: str) -> tuple[Proc, int]:
    """`python -m sandbox model|providers [args]` on a free port; returns the process and
    its port (`args`: e.g. the model server's `--scenarios DIR`)."""
    name = f"sandbox_{server}"
    port_file = procs.workdir / f"{name}.port"
    argv = _python("sandbox", server, "--port", "0", "--port-file", str(port_file), *args)
    proc = _start(procs, name, argv, _env())
    return proc, await proc.wait_port()


async def start_grpc_floor(procs: Procs, dsn: str | None = None) -> tuple[Proc, int]:
    """`python -m bench.grpc_floor` (a bare gRPC echo server, and with `dsn` the minimal
    commit server) on a free port; returns the process and its port."""
    name = "grpc_floor"
    port_file = procs.workdir / f"{name}.port"
    argv = _python("bench.grpc_floor", "--port-file", str(port_file))
    proc = _start(procs, name, argv + (["--dsn", dsn] if dsn else []), _env())
    return proc, await proc.wait_port()


@dataclass(frozen=True)
class ExecutorLinks:
    """Where executors connect: the control plane, the sandbox servers and Redis."""

    control_plane_port: int
    model_port: int
    providers_port: int
    redis_url: str
    rate_limits: str = ""  # AGENTRUN_RATE_LIMITS
    executor_key: str = ""  # AGENTRUN_EXECUTOR_KEY (api.mint_keys)

    def __repr__(self) -> str:  # never print the key
        return f"ExecutorLinks(control_plane_port={self.control_plane_port})"


def start_executor(
    procs: Procs,
    executor_id: str,
    links: ExecutorLinks,
    capacity: int,
    log_level: str = "WARNING",
    **extra_env: str,
) -> Proc:
    """`python -m executor` connected to the control plane, the sandbox servers and Redis.

    WARNING by default: its INFO log writes a line per run, which a benchmark need not pay.
    """
    env = _env(
        AGENTRUN_LOG_LEVEL=log_level,
        REDIS_URL=links.redis_url,
        AGENTRUN_RATE_LIMITS=links.rate_limits,
        AGENTRUN_CONTROL_PLANE=f"127.0.0.1:{links.control_plane_port}",
        AGENTRUN_MODEL_BASE_URL=f"http://127.0.0.1:{links.model_port}/v1",
        AGENTRUN_PROVIDERS_URL=f"http://127.0.0.1:{links.providers_port}",
        AGENTRUN_CAPACITY=str(capacity),
        AGENTRUN_EXECUTOR_ID=executor_id,
        AGENTRUN_EXECUTOR_KEY=links.executor_key,
        **extra_env,
    )
    return _start(procs, executor_id, _python("executor"), env)
