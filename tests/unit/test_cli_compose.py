"""docker-compose.yml runs what the CLI accepts: every agentrun command in it parses, and every
variable it sets is one the code reads (docker may not run here; these checks do)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun_cli.parser import parse

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SOURCES = ("control_plane", "executor", "agentrun_cli", "sandbox", "telemetry")


def _ours(service: dict[str, Any]) -> bool:
    return service.get("image") == "agentrun:dev"


def agentrun_invocations(command: list[str] | str) -> list[list[str]]:
    """The argv (after `agentrun`) of every agentrun call in a command, `sh -c` scripts too."""
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    if argv[:2] == ["sh", "-c"]:
        found = []
        for part in re.split(r"&&|\|\||;|\(|\)", argv[2]):
            words = [w for w in shlex.split(part.split(">")[0]) if not re.match(r"^\w+=", w)]
            words = words[1:] if words[:1] == ["exec"] else words
            if words[:1] == ["agentrun"]:
                found.append(words[1:])
        return found
    return [argv[1:]] if argv[:1] == ["agentrun"] else []


def calls() -> list[tuple[str, list[str]]]:
    return [
        (name, argv)
        for name, service in COMPOSE["services"].items()
        if _ours(service) and "command" in service
        for argv in agentrun_invocations(service["command"])
    ]


def test_the_stack_has_two_control_planes_and_executors_on_postgres_and_redis() -> None:
    commands = [argv[:1] for _, argv in calls()]
    assert commands.count(["server"]) == 2
    assert commands.count(["executor"]) >= 2
    assert {"postgres", "redis"} <= set(COMPOSE["services"])


@pytest.mark.parametrize(("service", "argv"), calls(), ids=lambda v: str(v))
def test_every_agentrun_command_parses(
    service: str, argv: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AGENTRUN_CONFIG", str(tmp_path / "none.toml"))
    args = parse(argv)  # argparse exits (SystemExit) on anything it does not accept
    assert callable(args.handler)


def test_a_command_the_cli_does_not_have_is_caught() -> None:
    with pytest.raises(SystemExit):
        parse(agentrun_invocations(["sh", "-c", "agentrun servr --bogus && true"])[0])


def _environment(service: dict[str, Any]) -> dict[str, Any]:
    env = service.get("environment") or {}
    return env if isinstance(env, dict) else dict(e.split("=", 1) for e in env)


def test_every_variable_set_is_read_by_the_code() -> None:
    code = "\n".join(p.read_text() for d in SOURCES for p in (REPO / d).rglob("*.py"))
    named = {k for s in COMPOSE["services"].values() if _ours(s) for k in _environment(s)}
    assert {"DATABASE_URL", "REDIS_URL", "AGENTRUN_CONTROL_PLANE"} <= named
    unread = sorted(k for k in named if f'"{k}"' not in code)
    assert not unread, f"docker-compose.yml sets variables nothing reads: {unread}"
