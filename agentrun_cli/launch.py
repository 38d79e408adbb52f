"""Handlers that run agentrun's own processes: server, executor, migrate and the dev stack."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import inspect
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from agentrun_cli import stack
from agentrun_cli.supervisor import StackError, Supervisor

if TYPE_CHECKING:
    from agentrun_cli.dev_loop import DevLoop


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
    placed = stack.migrate(url, citus=args.citus)
    print(f"migrated {stack.redact(url)}")
    if args.citus:
        print(f"distributed by {stack.citus_summary(placed)}")
    return 0


def admin_bootstrap(args: argparse.Namespace) -> int:
    """Mint a platform admin key straight into the database; the only time it is shown."""
    from control_plane.auth.bootstrap import first_platform_key

    url = stack.database_url(_data_dir(args))
    stack.migrate(url)
    key = asyncio.run(first_platform_key(url, args.principal))
    print(key)
    print(
        "platform admin key created; it is not shown again (export AGENTRUN_API_KEY=...)",
        file=sys.stderr,
    )
    return 0


def dev(args: argparse.Namespace) -> int:
    """Bring the stack up; then the demo (--demo) or wait for Ctrl-C; always stop it all."""
    from agentrun_cli import dev_loop

    agents, scenarios = _dir(args, "agents"), _dir(args, "scenarios")
    try:
        dev_loop.check_directory("--agents", agents)
        dev_loop.check_directory("--scenarios", scenarios)
    except ValueError as err:
        raise StackError(str(err)) from None
    data_dir = _data_dir(args)
    dev_stack = stack.DevStack(
        data_dir, Supervisor(data_dir / "logs"), port=_port(args.address), scenarios=scenarios
    )
    with _sigterm_as_interrupt():
        try:
            return _serve(args, dev_stack)
        except KeyboardInterrupt:
            say("\ninterrupted")
            return 130 if args.demo else 0
        except BrokenPipeError:  # the reader of our output left (`agentrun dev | tee`)
            return 1
        finally:
            _shutdown(dev_stack)


def _dir(args: argparse.Namespace, name: str) -> Path | None:
    value = getattr(args, name, None)
    return Path(value).absolute() if value else None


def say(text: str) -> None:
    """Print and flush; once stdout is a closed pipe, stay silent and carry on.

    Ctrl-C on `agentrun dev | tee log` ends `tee` too: a print that raised
    BrokenPipeError on the way out would skip the shutdown and leave every
    child running.
    """
    try:
        print(text, flush=True)
    except BrokenPipeError:
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _serve(args: argparse.Namespace, dev_stack: stack.DevStack) -> int:
    endpoints = dev_stack.start(say=say)
    say("agentrun dev is up:")
    for line in endpoints.lines():
        say(line)
    supervisor = dev_stack.supervisor
    loop = _dev_loop(args, endpoints.control_plane, dev_stack)  # applied before the demo too
    if args.demo:
        from agentrun_cli import demo

        return demo.run_demo(
            endpoints.control_plane, args.workspace, supervisor, dev_stack.data_dir
        )
    say(f"try: agentrun --address {endpoints.control_plane} runs list    (Ctrl-C stops all)")
    if loop is None:
        supervisor.failed.wait()
    else:
        watched = dict.fromkeys(str(d) for d in (loop.agents, loop.scenarios) if d)
        say(f"watching {', '.join(watched)} for changes")
        while not supervisor.failed.wait(loop.poll_seconds):
            loop.poll()
    assert supervisor.failure is not None
    raise StackError(supervisor.failure.describe_exit())


def _dev_loop(args: argparse.Namespace, address: str, dev_stack: stack.DevStack) -> DevLoop | None:
    """With --agents or --scenarios: the loop, its first pass applied (before `try:`)."""
    from agentrun_cli import credentials, dev_loop
    from agentrun_cli.client import Client

    agents, scenarios = _dir(args, "agents"), _dir(args, "scenarios")
    if agents is None and scenarios is None:
        return None
    key = credentials.api_key("admin", dev_stack.data_dir)
    loop = dev_loop.DevLoop(
        lambda: Client(address, args.workspace, key=key), say, agents, dev_stack.scenarios
    )
    loop.poll()
    return loop


def dev_options(parser: argparse.ArgumentParser) -> None:
    """`agentrun dev`'s options for a user's own agents (agentrun_cli/dev_loop.py)."""
    parser.add_argument(
        "--agents",
        metavar="DIR",
        help="apply the agent and tool files of DIR at start and whenever one changes",
    )
    parser.add_argument(
        "--scenarios",
        metavar="DIR",
        help="scenario files the model sandbox plays (model: <file name>), before the "
        "built-in ones; read again when changed",
    )


def _shutdown(dev_stack: stack.DevStack) -> None:
    supervisor = dev_stack.supervisor
    if not supervisor.children and not dev_stack.embedded:
        return
    previous = signal.signal(signal.SIGINT, lambda *_: supervisor.kill_all())
    try:
        say("stopping (Ctrl-C again to kill the processes)")
        dev_stack.stop()
    finally:
        signal.signal(signal.SIGINT, previous)
    say("stopped")


def _port(address: str) -> int:
    """The port of `host:port`, for the control plane to listen on (default 50051)."""
    try:
        return int(address.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return stack.DEFAULT_PORT


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP stop the stack the way Ctrl-C does (children are not left behind).

    SIGINT too, explicitly: a shell without job control starts `agentrun dev &` with SIGINT
    ignored, and Python then leaves it ignored.
    """
    previous = {
        sig: signal.signal(sig, signal.default_int_handler)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
