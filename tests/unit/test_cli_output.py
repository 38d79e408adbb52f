"""The CLI's output machinery, agent files and error lines: pure functions, no server."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import grpc
import pytest

from agentrun.v1 import agent_pb2, approval_pb2, run_pb2
from agentrun_cli import agent_files, errors, output, render, tool_files
from agentrun_cli.agent_files import AgentFileError
from agentrun_cli.main import main
from agentrun_cli.output import Column
from agentrun_cli.parser import parse

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
COLUMNS = [Column("name", lambda r: r["name"]), Column("count", lambda r: r["n"], right=True)]
ROWS = [{"name": "alpha", "n": 3}, {"name": "b", "n": 120}]


def args(form: str) -> argparse.Namespace:
    ns = argparse.Namespace(output=form, json=False)
    output.settle(ns)
    return ns


def test_a_piped_table_is_aligned_with_headers_and_no_trailing_blanks(capsys) -> None:
    output.emit_list(args("table"), ROWS, COLUMNS, empty="none")
    assert capsys.readouterr().out.splitlines() == ["NAME   COUNT", "alpha      3", "b        120"]


def test_json_is_one_document_and_jsonl_one_object_a_line(capsys) -> None:
    runs = [run_pb2.Run(run_id="r1", status=run_pb2.RUN_STATUS_WAITING), run_pb2.Run(run_id="r2")]
    output.emit_list(args("json"), runs, COLUMNS, empty="none")
    doc = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in doc] == ["r1", "r2"] and doc[0]["status"] == "RUN_STATUS_WAITING"
    output.emit_list(args("jsonl"), runs, COLUMNS, empty="none")
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["run_id"] for line in lines] == ["r1", "r2"]


def test_an_empty_list_says_why_on_stderr_and_keeps_stdout_data(capsys) -> None:
    output.emit_list(args("table"), [], COLUMNS, empty="no runs yet: start one")
    out = capsys.readouterr()
    assert (out.out, out.err) == ("", "no runs yet: start one\n")
    output.emit_list(args("json"), [], COLUMNS, empty="no runs yet")
    assert json.loads(capsys.readouterr().out) == []


def test_colour_only_on_a_terminal_without_no_color(monkeypatch) -> None:
    class Tty:
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert not output.colour()  # pytest's captured stdout is not a terminal
    monkeypatch.setattr("sys.stdout", Tty())
    assert output.colour()
    monkeypatch.setenv("NO_COLOR", "1")
    assert not output.colour()


def test_on_a_terminal_rich_draws_the_table_with_colour(monkeypatch, capsys) -> None:
    monkeypatch.setattr(output, "colour", lambda: True)
    red = [Column("status", lambda r: r, style=lambda r: "red")]
    output.print_table(["failed [x]"], red)
    text = capsys.readouterr().out
    assert "STATUS" in text and "failed [x]" in text and "\x1b[31m" in text


def test_output_flags_everywhere_and_json_stays_an_alias() -> None:
    assert parse(["runs", "list", "-o", "jsonl"]).output == "jsonl"
    assert parse(["-o", "json", "agents", "list"]).output == "json"
    assert parse(["agents", "list", "--json"]).output == "json"
    assert parse(["agents", "list"]).output == "table"
    with pytest.raises(SystemExit):
        parse(["runs", "list", "-o", "yaml"])
    with pytest.raises(SystemExit):
        parse(["runs", "list", "--since", "yesterday"])


def test_version(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        parse(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("agentrun ")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (0.25, "250ms"),
        (12.34, "12.3s"),
        (245, "4m05s"),
        (7380, "2h03m"),
        (3 * 86400 + 4 * 3600, "3d04h"),
    ],
)
def test_durations(seconds, text) -> None:
    assert render.duration(seconds) == text


def test_tokens() -> None:
    assert [render.tokens(n) for n in (950, 12_400, 3_100_000)] == ["950", "12.4k", "3.1M"]


# --- agent files -------------------------------------------------------------------------------


def test_the_example_file_says_everything_a_spec_holds() -> None:
    file = agent_files.load(str(EXAMPLES / "triage.yaml"))
    spec = file.spec
    assert (file.agent_id, file.display_name) == ("triage", "Triage desk")
    assert list(spec.tools) == ["crm_lookup", "send_email"] and spec.model == "demo"
    assert spec.limits.deadline.seconds == 600 and spec.limits.max_age.seconds == 7 * 86400
    assert spec.approval.expiry_seconds == 86400
    assert spec.approval.on_expiry == approval_pb2.EXPIRY_ACTION_REJECT
    assert spec.constraints[0].rule == agent_pb2.CONSTRAINT_RULE_RECIPIENT_KNOWN_OR_APPROVAL
    assert spec.max_concurrency == 5 and spec.instructions.startswith("You answer")


def test_connections_and_numbers_of_seconds() -> None:
    doc = {"agent": "a", "model": "m", "limits": {"deadline": 90}, "connections": {"mail": "c1"}}
    spec = agent_files.parse(doc).spec
    assert spec.limits.deadline.seconds == 90 and dict(spec.connections) == {"mail": "c1"}


def test_unknown_keys_are_all_named_with_the_nearest_known_one() -> None:
    doc = {
        "agent": "a",
        "model": "m",
        "tool": ["x"],
        "limits": {"max_step": 3},
        "constraints": [{"tool": "x", "rul": "amount_at_most"}],
    }
    with pytest.raises(AgentFileError) as err:
        agent_files.parse(doc, "a.yaml")
    message = str(err.value)
    assert message.startswith("a.yaml: unknown keys: ")
    for part in (
        "tool (did you mean tools?)",
        "limits.max_step (did you mean limits.max_steps?)",
        "constraints[0].rul (did you mean constraints[0].rule?)",
    ):
        assert part in message


@pytest.mark.parametrize(
    "doc",
    [
        [1, 2],
        {"model": "m"},
        {"agent": "a", "limits": {"deadline": "soon"}},
        {"agent": "a", "limits": {"max_steps": "many"}},
        {"agent": "a", "approval": {"on_expiry": "x"}},
    ],
)
def test_bad_files_are_refused_with_a_reason(doc) -> None:
    with pytest.raises(AgentFileError, match="f.yaml: "):
        agent_files.parse(doc, "f.yaml")


def test_a_file_that_is_not_yaml(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("agent: [unclosed\n")
    with pytest.raises(AgentFileError, match="cannot read it"):
        agent_files.load(str(bad))


@pytest.mark.parametrize("levels", [900, 50_000])
def test_a_file_nested_past_the_reader_is_one_error_line(tmp_path, levels) -> None:
    """Before: a RecursionError traceback from the YAML reader (or from reading the spec)."""
    deep = tmp_path / "deep.yaml"
    deep.write_text("agent: a\nmetadata: " + "[" * levels + "]" * levels + "\n")
    with pytest.raises(AgentFileError, match="deep.yaml: cannot read it: nested too deeply"):
        agent_files.load(str(deep))
    with pytest.raises(tool_files.ToolFileError, match="cannot read it: nested too deeply"):
        tool_files.load(str(deep))


def test_arguments_nested_past_the_reader_are_one_error_line() -> None:
    levels = 50_000  # past Python's JSON reader (the server refuses past 64 itself)
    args = [
        "approvals",
        "edit",
        "a1",
        "--address",
        "127.0.0.1:1",
        "--arguments",
        "[" * levels + "]" * levels,
    ]
    with pytest.raises(SystemExit, match="--arguments is nested too deeply"):
        main(args)


# --- errors ------------------------------------------------------------------------------------


class Failed(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def test_every_failure_is_a_line_and_a_hint() -> None:
    down = errors.lines(
        Failed(grpc.StatusCode.UNAVAILABLE, "connection refused"),
        argparse.Namespace(address="127.0.0.1:1"),
    )
    assert down[0] == "error: cannot reach the control plane at 127.0.0.1:1 (connection refused)"
    assert "agentrun dev" in down[1]
    for code in grpc.StatusCode:
        if code is grpc.StatusCode.OK:
            continue
        text = errors.lines(Failed(code, "first line\nsecond"), None)
        assert text[0].startswith("error: ") and "second" not in text[0]
        if code is not grpc.StatusCode.CANCELLED:
            assert len(text) == 2 and text[1].startswith("hint: "), code
