"""`agentrun tools sync --apply` at a terminal: the diff is shown, then saved only on yes."""

from __future__ import annotations

import pytest

from agentrun.v1 import tool_pb2 as pb
from agentrun_cli import mcp

SHOWN = pb.SyncMcpServerResponse(
    changes=[
        pb.ToolChange(kind=pb.ToolChange.KIND_REMOVED, name="desk__list_tickets"),
        pb.ToolChange(
            kind=pb.ToolChange.KIND_CHANGED,
            name="desk__create_ticket",
            fields=["annotations"],
            needs_class=True,
            proposed=pb.Tool(access=pb.TOOL_ACCESS_WRITE),
            proposed_class=pb.IDEMPOTENCY_CLASS_PROVIDER_KEY,
        ),
    ],
    digest="0123456789abcdef",
)


@pytest.mark.parametrize(
    ("answer", "saved"), [("y", True), ("YES", True), ("", False), ("n", False)]
)
def test_the_diff_is_shown_and_saved_only_on_yes(answer, saved, monkeypatch, capsys):
    asked: list[str] = []
    monkeypatch.setattr("builtins.input", lambda prompt: asked.append(prompt) or answer)
    assert mcp._confirmed("desk", SHOWN) is saved
    err = capsys.readouterr().err
    assert "- desk__list_tickets  no longer listed: applying retires it" in err
    assert "~ desk__create_ticket  annotations  write, proposed provider_key: needs --class" in err
    assert asked == ["save these 2 changes of desk? [y/N] "]
    assert ("nothing saved" in err) is not saved


def test_an_empty_diff_asks_nothing(monkeypatch):
    monkeypatch.setattr("builtins.input", lambda prompt: pytest.fail("asked"))
    assert mcp._confirmed("desk", pb.SyncMcpServerResponse())
