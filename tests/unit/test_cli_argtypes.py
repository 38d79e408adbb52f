"""Numbers on the command line: refused at parsing when no request field can hold them."""

from __future__ import annotations

import pytest

from agentrun_cli.main import main
from agentrun_cli.parser import parse


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["runs", "list", "--limit", "99999999999"], "--limit: 99999999999 is out of range"),
        (["runs", "list", "--limit", "ten"], "--limit: 'ten' is not a whole number"),
        (["workspaces", "set-retention", "99999999999999999999", "--id", "w"], "out of range"),
        (["canary", "--timeout", "nan"], "--timeout: 'nan' is not a duration"),
        (["canary", "--timeout", "-5"], "--timeout: '-5' must be between 0 and"),
        (["credits", "grant", "inf"], "'inf': expected a finite number of credits"),
        (["credits", "grant", "99999999999999999999"], "too many credits"),
        (["agents", "publish", "a", "--temperature", "inf"], "--temperature: 'inf'"),
    ],
)
def test_a_number_no_field_can_hold_is_a_usage_error(argv, words, capsys) -> None:
    """It was a traceback: protobuf's "Value out of range", Duration's NaN conversion."""
    with pytest.raises(SystemExit) as exited:
        parse(argv)
    assert exited.value.code == 2
    assert words in capsys.readouterr().err


def test_numbers_in_range_parse() -> None:
    assert parse(["runs", "list", "--limit", "2147483647"]).limit == 2147483647
    assert parse(["canary", "--timeout", "1.5"]).timeout == 1.5
    assert parse(["credits", "grant", "0.5"]).amount == 500_000


def test_a_file_that_is_not_there_is_one_line_naming_it(capsys, tmp_path) -> None:
    missing = tmp_path / "nope.yaml"
    assert main(["tools", "import-openapi", str(missing), "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == f"error: {missing}: No such file or directory", err
