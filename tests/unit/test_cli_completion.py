"""`agentrun completion SHELL`: a script generated from the CLI's own parser (shtab), which
the shell accepts and which completes commands, subcommands and choices."""

from __future__ import annotations

import contextlib
import io
import shutil
import subprocess
from pathlib import Path

import pytest

from agentrun_cli.main import main
from agentrun_cli.parser import COMPLETION_SHELLS


@pytest.fixture(scope="module")
def bash_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("bash") is None:
        pytest.skip("no bash on this machine")
    path = tmp_path_factory.mktemp("completion") / "agentrun.bash"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["completion", "bash"]) == 0
    path.write_text(out.getvalue())
    return path


def complete(script: Path, line: str) -> list[str]:
    """What TAB offers at the end of `line`, as bash's programmable completion asks it."""
    words = line.split(" ")
    program = f"""
source {script}
COMP_WORDS=({" ".join(f"'{w}'" for w in words)})
COMP_CWORD={len(words) - 1}
COMP_LINE='{line}'
COMP_POINT=${{#COMP_LINE}}
_shtab_agentrun
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    done = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", program],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return [w for w in done.stdout.split() if w]


def test_the_bash_script_is_valid_bash(bash_script: Path) -> None:
    subprocess.run(["bash", "-n", str(bash_script)], check=True, timeout=30)
    assert "complete -o bashdefault -F _shtab_agentrun agentrun" in bash_script.read_text()


def test_bash_completes_commands_subcommands_and_choices(bash_script: Path) -> None:
    assert complete(bash_script, "agentrun ru") == ["runs"]
    assert {"list", "start", "show", "cancel"} <= set(complete(bash_script, "agentrun runs "))
    assert complete(bash_script, "agentrun runs list --status c") == ["completed", "cancelled"]
    assert "completion" in complete(bash_script, "agentrun comp")


@pytest.mark.parametrize("shell", [s for s in COMPLETION_SHELLS if s != "bash"])
def test_every_other_shell_gets_a_script(shell: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", shell]) == 0
    assert "agentrun" in capsys.readouterr().out


def test_an_unknown_shell_is_a_usage_error_naming_the_choices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["completion", "powershell"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "powershell" in err and "bash" in err
