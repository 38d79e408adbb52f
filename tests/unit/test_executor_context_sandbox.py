"""The sandbox model's side of summaries: it answers a summarisation request the
executor builds, plays the right turn after a recap, and records prompts."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from starlette.exceptions import StarletteDeprecationWarning

from executor import context
from sandbox.model_server import create_app
from sandbox.scenario import ScenarioError, parse_scenario

with warnings.catch_warnings():
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

TOOLS = [{"type": "function", "function": {"name": "echo", "parameters": {"type": "object"}}}]


def turn(i: int) -> dict[str, Any]:
    return {"content": f"turn {i}", "tool_calls": [{"name": "echo", "arguments": {"text": str(i)}}]}


@pytest.fixture
def client(tmp_path: Path) -> TestClient:
    doc = {
        "turns": [turn(i) for i in range(6)],
        "summary": {"content": "R-{{nonce}}"},
        "record_prompts": True,
    }
    (tmp_path / "recaps.json").write_text(json.dumps(doc))
    (tmp_path / "plain.json").write_text(json.dumps({"turns": [turn(0)]}))
    return TestClient(create_app(scenarios_dir=tmp_path))


def chat(assistant_turns: int, start: int = 0) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "go"},
    ]
    for i in range(start, start + assistant_turns):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "echo", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "{}"})
    return messages


def ask(client: TestClient, model: str, messages: list[dict[str, Any]], seq: int = 0) -> Any:
    body = {"model": model, "messages": messages, "tools": TOOLS}
    response = client.post(
        "/v1/chat/completions",
        json=body,
        headers={"X-Agentrun-Run-Id": "r", "X-Agentrun-Seq": str(seq)},
    )
    return response


def content(response: Any) -> str:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def test_a_summarisation_request_gets_the_scenarios_recap_with_the_turns_it_covers(client):
    ask_recap = [*chat(3), {"role": "user", "content": context.REQUEST_TEXT}]
    recap = content(ask(client, "recaps", ask_recap, seq=10))
    assert recap.startswith("R-") and recap.endswith("\n[sandbox recap of 3 model turns]")
    again = content(ask(client, "recaps", ask_recap, seq=10))
    assert again != recap  # a fresh nonce: a recap asked for twice shows
    (logged, _) = client.get("/_sandbox/requests").json()["requests"]
    assert logged["summary"] is True and logged["turn"] is None and logged["seq"] == 10


def test_after_a_recap_the_scenario_goes_on_from_the_turns_it_replaced(client):
    recap = content(
        ask(client, "recaps", [*chat(3), {"role": "user", "content": context.REQUEST_TEXT}])
    )
    # The prompt now: instructions, input, the recap, then the one turn kept verbatim.
    messages = chat(1, start=3)
    messages.insert(2, {"role": "user", "content": f"[Recap of steps 1-9]\n{recap}"})
    assert content(ask(client, "recaps", messages)) == "turn 4"
    # A second recap counts the first one's turns too.
    second = content(
        ask(client, "recaps", [*messages, {"role": "user", "content": context.REQUEST_TEXT}])
    )
    assert second.endswith("[sandbox recap of 4 model turns]")
    entries = client.get("/_sandbox/requests").json()["requests"]
    assert entries[1]["turn"] == 4 and "summary" not in entries[1]


def test_a_scenario_without_the_option_refuses_to_summarise(client):
    response = ask(client, "plain", [*chat(1), {"role": "user", "content": context.REQUEST_TEXT}])
    assert response.status_code == 500
    assert "answers no summarisation request" in response.json()["error"]["message"]


def test_recorded_prompts_put_the_system_message_then_the_tools_first(client):
    ask(client, "recaps", chat(1))
    ask(client, "recaps", chat(2))
    ask(client, "plain", chat(0))
    first, second, plain = client.get("/_sandbox/requests").json()["requests"]
    lines = first["prompt"].splitlines()
    assert json.loads(lines[0]) == {"role": "system", "content": "be brief"}
    assert json.loads(lines[1]) == {"tools": TOOLS}
    assert [json.loads(line) for line in lines[2:]] == chat(1)[1:]
    assert second["prompt"].startswith(first["prompt"])
    assert "prompt" not in plain  # only scenarios that ask for it keep prompts


def test_the_summary_option_is_checked():
    with pytest.raises(ScenarioError, match="'summary'"):
        parse_scenario("x", {"turns": [turn(0)], "summary": "yes"})
    assert parse_scenario("x", {"turns": [turn(0)], "summary": True}).summary is True
