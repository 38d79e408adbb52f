"""Handlers that run agentrun's own processes: server, executor, migrate and the dev stack."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import inspect
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

from agentrun_cli import stack
from agentrun_cli.supervisor import StackError, Supervisor


def server(args: argparse.Namespace) -> int:
    """The control plane, in this process (configured by its environment)."""
    return _run_main("control_plane.server", "agentrun server", args.args)


def executor(args: argparse.Namespace) -> int:
    """One executor, in this process (configured by its environment)."""
    return _run_main("executor.__main__", "agentrun executor", args.args)


def _run_main(module: str, prog: str, argv: list[str]) -> int:
    # Imported here: the CLI must work for client commands without server code loaded.
    entry = importlib.import_module(module).main
    sys.argv = [prog, *argv]  # in case the entry point parses its own arguments
    result = entry()
    if inspect.iscoroutine(result):
        result = asyncio.run(result)
    return result if isinstance(result, int) else 0


def _data_dir(args: argparse.Namespace) -> Path:
    return Path(args.data_dir) if args.data_dir else stack.default_data_dir()


def migrate(args: argparse.Namespace) -> int:
    url = stack.database_url(_data_dir(args))
    stack.migrate(url)
    print(f"migrated {stack.redact(url)}")
    return 0


def admin_bootstrap(args: argparse.Namespace) -> int:
    """Mint a platform admin key straight into the database; the only time it is shown."""
    from control_plane.auth.bootstrap import first_platform_key

    url = stack.database_url(_data_dir(args))
    stack.migrate(url)
    key = asyncio.run(first_platform_key(url, args.principal))
    print(key)
    print("platform admin key created; it is not shown again (export AGENTRUN_API_KEY=...)",
          file=sys.stderr)  # fmt: skip
    return 0


def dev(args: argparse.Namespace) -> int:
    """Bring the stack up; then the demo (--demo) or wait for Ctrl-C; always stop it all."""
    data_dir = _data_dir(args)
    dev_stack = stack.DevStack(data_dir, Supervisor(data_dir / "logs"), port=_port(args.address))
    with _sigterm_as_interrupt():
        try:
            return _serve(args, dev_stack)
        except KeyboardInterrupt:
            print("\ninterrupted", flush=True)
            return 130 if args.demo else 0
        finally:
            _shutdown(dev_stack)


def _serve(args: argparse.Namespace, dev_stack: stack.DevStack) -> int:
    endpoints = dev_stack.start()
    print("agentrun dev is up:")
    for line in endpoints.lines():
        print(line)
    supervisor = dev_stack.supervisor
    if args.demo:
        from agentrun_cli import demo

        return demo.run_demo(
            endpoints.control_plane, args.workspace, supervisor, dev_stack.data_dir
        )
    print(f"try: agentrun --address {endpoints.control_plane} runs list    (Ctrl-C stops all)")
    sys.stdout.flush()
    supervisor.failed.wait()
    assert supervisor.failure is not None
    raise StackError(supervisor.failure.describe_exit())


def _shutdown(dev_stack: stack.DevStack) -> None:
    supervisor = dev_stack.supervisor
    if not supervisor.children and not dev_stack.embedded:
        return
    print("stopping (Ctrl-C again to kill the processes)", flush=True)
    previous = signal.signal(signal.SIGINT, lambda *_: supervisor.kill_all())
    try:
        dev_stack.stop()
    finally:
        signal.signal(signal.SIGINT, previous)
    print("stopped", flush=True)


def _port(address: str) -> int:
    """The port of `host:port`, for the control plane to listen on (default 50051)."""
    try:
        return int(address.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return stack.DEFAULT_PORT


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP stop the stack the way Ctrl-C does (children are not left behind)."""
    previous = {
        sig: signal.signal(sig, signal.default_int_handler)
        for sig in (signal.SIGTERM, signal.SIGHUP)
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
