"""Every CLI command, given hostile arguments, ends in a usage error, a one-line error or
its output: never a traceback, never a hang.

The commands come from the argument parser (a new command is fuzzed without touching
this file): each leaf command gets positional and option values that callers get wrong
(huge and negative numbers, NaN and infinity, malformed JSON, durations and cron, paths
that do not exist or hold garbage, a byte that is not UTF-8, long and non-ASCII text),
sent with a workspace admin's key or a platform admin's to a real control plane. Left
out: the commands that run processes (server, executor, dev, migrate), the interactive
chat, and those that follow a stream until it ends (watch, --follow).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import random
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrun_cli import credentials
from agentrun_cli.devstack import EmbeddedPostgres, EmbeddedRedis
from agentrun_cli.main import main
from agentrun_cli.parser import build_parser
from tests.harness import auth

SKIPPED = {"server", "executor", "dev", "migrate", "chat", "watch"}
TRIES_PER_COMMAND = 6
SECONDS = 20  # a command's longest


def _leaves(parser: argparse.ArgumentParser, path: list[str]) -> Iterator[tuple[list[str], Any]]:
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers:
        yield path, parser
        return
    for name, sub in subparsers[0].choices.items():
        if name not in SKIPPED:
            yield from _leaves(sub, [*path, name])


def _values(folder: Path) -> list[str]:
    garbage, listed = folder / "garbage.json", folder / "list.json"
    garbage.write_bytes(b"\xff\xfe{not json")
    listed.write_text('[1, "x", null]')
    return [
        "",
        "x",
        "default",
        "a" * 300,
        "é",
        "\udcff",
        "-1",
        "0",
        "-100",
        "2147483648",
        "99999999999999999999",
        "1.5",
        "nan",
        "inf",
        "{}",
        "[]",
        '{"a":',
        "null",
        "00000000-0000-0000-0000-000000000000",
        "not-a-uuid",
        "2020-13-45",
        "1h",
        "-5s",
        "*/0 * * * *",
        "http://",
        "ftp://x",
        "key=value",
        "=",
        "a,b,,c",
        "/nonexistent/file",
        str(garbage),
        str(listed),
        str(folder),
    ]


def _value(rng: random.Random, choices: list[str], values: list[str]) -> str:
    return rng.choice(choices) if choices and rng.random() < 0.6 else rng.choice(values)


def _argv(path: list[str], parser: Any, rng: random.Random, values: list[str]) -> list[str]:
    argv = list(path)
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.dest in (
            "address",
            "profile",
            "workspace",
            "output",
            "data_dir",
            "follow",
        ):
            continue
        choices = [str(c) for c in action.choices or ()]
        if not action.option_strings:
            many = rng.randrange(1, 3) if action.nargs == "+" else 1
            argv += [_value(rng, choices, values) for _ in range(many)]
        elif rng.random() < (0.9 if action.required else 0.4):
            flag = rng.choice(action.option_strings)
            argv += [flag] if action.nargs == 0 else [flag, _value(rng, choices, values)]
    return argv


def _run(argv: list[str]) -> tuple[int | str | None, str]:
    """main(argv), as the `agentrun` process would run it: its exit code and stderr, and
    the traceback if it raised."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code: int | str | None = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    except BaseException:  # noqa: BLE001 - what the test looks for
        code = "raised"
        err.write(traceback.format_exc())
    return code, err.getvalue()


def _stop_embedded_stores(data_dir: Path) -> None:
    """Commands that need the database and find no DATABASE_URL (`migrate`, `admin
    bootstrap`) start an embedded Postgres under the data dir and leave it running for
    the next command, as they should on a developer's machine; the test stops them."""
    if (data_dir / "postgres" / "postmaster.pid").exists():
        EmbeddedPostgres(data_dir / "postgres").start().stop()
    if (data_dir / "redis").exists():
        EmbeddedRedis(data_dir / "redis").start().stop()


async def test_every_cli_command_refuses_hostile_arguments_in_one_line(
    control_plane, db_url, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp = control_plane(db_url)
    keys = [await auth.workspace_key(db_url, "default"), await auth.platform_key(db_url)]
    for name in ("AGENTRUN_PROFILE", "AGENTRUN_TLS_CA", "AGENTRUN_TLS_SERVER_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AGENTRUN_CONFIG", str(tmp_path / "config.toml"))
    monkeypatch.setenv("AGENTRUN_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("AGENTRUN_ADDRESS", cp.address)
    monkeypatch.chdir(tmp_path)  # files a command writes (kms init) stay here
    rng, values = random.Random(5), _values(tmp_path)
    commands = list(_leaves(build_parser(), []))
    assert len(commands) >= 60, [c for c, _ in commands]
    bad, codes = [], []
    try:
        for path, parser in commands:
            for _ in range(TRIES_PER_COMMAND):
                argv = _argv(path, parser, rng, values)
                monkeypatch.setenv("AGENTRUN_API_KEY", rng.choice(keys))
                try:  # in a thread of its own: no event loop there, as in the real process
                    code, err = await asyncio.wait_for(asyncio.to_thread(_run, argv), SECONDS)
                except TimeoutError:
                    code, err = "hung", ""
                credentials.activate(None)
                codes.append(code)
                if code in ("hung", "raised") or "Traceback" in err:
                    bad.append(f"{argv!r}: {code}\n{err[-1200:]}")
    finally:
        _stop_embedded_stores(tmp_path)
    assert not bad, "\n".join(bad[:10])
    # Some commands did their work, some were refused: the server was reached.
    assert codes.count(0) >= 10 and codes.count(1) >= 10 and codes.count(2) >= 10, codes
