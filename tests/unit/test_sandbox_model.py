"""The model sandbox: scenario turns, templating, randomness, auth, request log, faults."""

import hashlib
import json
import random
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.exceptions import StarletteDeprecationWarning

from executor.tools.catalogue import Catalogue
from sandbox.model_server import create_app
from sandbox.providers.shop import openapi_document
from sandbox.scenario import DEFAULT_DIR, ScenarioError, ScenarioStore, parse_scenario, render_turn

with warnings.catch_warnings():
    # starlette 1.x would rather its test client ran on httpx2; we pin httpx.
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

REPO = Path(__file__).resolve().parents[2]
CATALOGUE = set(Catalogue.load().tools)
# Tools a workspace imports from the shop sandbox's OpenAPI document (by operationId).
SHOP_TOOLS = {
    op["operationId"]
    for item in openapi_document("").get("paths", {}).values()
    for op in item.values()
}


def ask(client: TestClient, model: str, messages: list[dict[str, Any]], **headers: str):
    return client.post(
        "/v1/chat/completions", json={"model": model, "messages": messages}, headers=headers
    )


def conversation(assistant_turns: int, tool_result: str = "{}") -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "follow up with ada"}]
    for i in range(assistant_turns):
        messages.append({"role": "assistant", "content": None, "tool_calls": []})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": tool_result})
    return messages


def tool_calls(response: httpx.Response) -> list[dict[str, Any]]:
    message = response.json()["choices"][0]["message"]
    return [
        {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
        for c in message.get("tool_calls", [])
    ]


@pytest.fixture
def client() -> TestClient:
    return TestClient(create_app())


@pytest.fixture
def scenario_dir(tmp_path: Path) -> Path:
    turns = [
        {"tool_calls": [{"name": "echo", "arguments": {"text": "asked: {{input}}"}}]},
        {"tool_calls": [{"$choice": [{"name": "a"}, {"name": "b"}]}]},
        {"tool_calls": [{"name": "echo", "arguments_raw": "{not json"}]},
        {"content": "tool said {{last_tool_result}}"},
    ]
    (tmp_path / "custom.json").write_text(json.dumps({"turns": turns}))
    return tmp_path


def test_turn_is_the_number_of_assistant_messages(client: TestClient) -> None:
    assert [c["name"] for c in tool_calls(ask(client, "demo", conversation(0)))] == ["crm_lookup"]
    assert [c["name"] for c in tool_calls(ask(client, "demo", conversation(1)))] == ["send_email"]
    final = ask(client, "demo", conversation(2)).json()["choices"][0]
    assert final["finish_reason"] == "stop"
    assert final["message"]["content"] == "Followed up with Ada."
    assert "tool_calls" not in final["message"]
    # Past the last turn the last one is played again.
    again = ask(client, "demo", conversation(7)).json()["choices"][0]
    assert again["message"]["content"] == "Followed up with Ada."


def test_completion_is_in_the_openai_format(client: TestClient) -> None:
    body = ask(client, "demo", conversation(0)).json()
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert body["model"] == "demo" and isinstance(body["created"], int)
    choice = body["choices"][0]
    assert choice["index"] == 0 and choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert json.loads(call["function"]["arguments"]) == {"email": "ada@example.com"}
    usage = body["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_templates_fill_in_input_and_last_tool_result(scenario_dir: Path) -> None:
    client = TestClient(create_app(scenarios_dir=scenario_dir))
    parts = [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    assert tool_calls(ask(client, "custom", parts))[0]["arguments"] == {"text": "asked: hello"}
    final = ask(client, "custom", conversation(3, tool_result='{"echo": "hi"}'))
    assert final.json()["choices"][0]["message"]["content"] == 'tool said {"echo": "hi"}'


def test_arguments_raw_is_sent_verbatim(scenario_dir: Path) -> None:
    client = TestClient(create_app(scenarios_dir=scenario_dir))
    message = ask(client, "custom", conversation(2)).json()["choices"][0]["message"]
    assert message["tool_calls"][0]["function"]["arguments"] == "{not json"


def test_nonce_and_argument_choice_differ_between_asks(client: TestClient) -> None:
    asks = [tool_calls(ask(client, "writer", conversation(1)))[0] for _ in range(20)]
    assert {a["name"] for a in asks} == {"send_email"}
    assert len({a["arguments"]["subject"] for a in asks}) > 1
    assert {a["arguments"]["to"] for a in asks} == {"ada@example.com", "grace@example.com"}
    texts = {
        tool_calls(ask(client, "steps10", conversation(0)))[0]["arguments"]["text"]
        for _ in range(20)
    }
    assert len(texts) > 1 and all(len(t) == 8 for t in texts)


def test_choice_can_pick_a_whole_tool_call(scenario_dir: Path) -> None:
    client = TestClient(create_app(scenarios_dir=scenario_dir))
    names = {tool_calls(ask(client, "custom", conversation(1)))[0]["name"] for _ in range(30)}
    assert names == {"a", "b"}


def test_unknown_scenario_is_404_with_an_openai_error(client: TestClient) -> None:
    response = ask(client, "no-such-model", conversation(0))
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert "no-such-model" in response.json()["error"]["message"]
    assert ask(client, "../demo", conversation(0)).status_code == 404


def test_api_key_is_required_when_configured() -> None:
    client = TestClient(create_app(api_key="sk-test"))
    assert ask(client, "demo", conversation(0)).status_code == 401
    wrong = ask(client, "demo", conversation(0), Authorization="Bearer nope")
    assert wrong.status_code == 401
    assert wrong.json()["error"]["type"] == "invalid_request_error"
    assert ask(client, "demo", conversation(0), Authorization="Bearer sk-test").status_code == 200


def test_malformed_request_is_400(client: TestClient) -> None:
    assert client.post("/v1/chat/completions", content=b"not json").status_code == 400
    assert client.post("/v1/chat/completions", json={"model": "demo"}).status_code == 400


def test_request_log_records_run_id_seq_turn_and_status(client: TestClient) -> None:
    first = ask(
        client, "demo", conversation(1), **{"X-Agentrun-Run-Id": "run-1", "X-Agentrun-Seq": "4"}
    )
    ask(client, "missing", conversation(0))
    entries = client.get("/_sandbox/requests").json()["requests"]
    assert [e["n"] for e in entries] == [1, 2]
    assert entries[0]["received_at"] <= entries[0]["time"]
    assert entries[0] | {"time": None, "received_at": None} == {
        "n": 1,
        "time": None,
        "received_at": None,
        "model": "demo",
        "run_id": "run-1",
        "seq": 4,
        "n_messages": 3,
        "turn": 1,
        "response_id": first.json()["id"],
        "api": "openai",
        "params": {},
        "status": 200,
        # What the model was shown last as a tool result ("{}"), by size and hash.
        "last_tool_bytes": 2,
        "last_tool_sha256": hashlib.sha256(b"{}").hexdigest(),
    }
    assert entries[1]["run_id"] is None and entries[1]["seq"] is None
    assert entries[1]["status"] == 404 and entries[1]["response_id"] is None
    assert client.delete("/_sandbox/requests").json() == {"requests": []}
    assert client.get("/_sandbox/requests").json() == {"requests": []}


def test_down_fault_answers_with_status_and_retry_after(client: TestClient) -> None:
    armed = client.post("/_sandbox/faults", json={"down": True, "status": 503, "retry_after": 2})
    assert armed.json()["down"] is True
    response = ask(client, "demo", conversation(0))
    assert response.status_code == 503
    assert response.headers["retry-after"] == "2"
    assert response.json()["error"]["type"] == "server_error"
    assert client.get("/_sandbox/requests").json()["requests"][-1]["status"] == 503
    client.delete("/_sandbox/faults")
    assert client.get("/_sandbox/faults").json()["down"] is False
    assert ask(client, "demo", conversation(0)).status_code == 200


def test_fault_count_limits_an_outage_to_the_next_requests(client: TestClient) -> None:
    client.post("/_sandbox/faults", json={"down": True, "status": 429, "count": 2})
    statuses = [ask(client, "demo", conversation(0)).status_code for _ in range(3)]
    assert statuses == [429, 429, 200]
    assert "retry-after" not in ask(client, "demo", conversation(0)).headers


def test_fault_delay_slows_every_answer(client: TestClient) -> None:
    client.post("/_sandbox/faults", json={"delay_ms": 50})
    started = time.monotonic()
    assert ask(client, "demo", conversation(0)).status_code == 200
    assert time.monotonic() - started >= 0.05


def test_bad_fault_spec_is_400(client: TestClient) -> None:
    response = client.post("/_sandbox/faults", json={"down": True, "status": 200})
    assert response.status_code == 400 and "status" in response.json()["error"]


def test_shipped_scenarios_parse_and_use_catalogue_tools() -> None:
    store = ScenarioStore(DEFAULT_DIR)
    names = store.names()
    assert {"demo", "sleepy", "steps10", "writer", "bad_tool"} <= set(names)
    used = set()
    for name in names:
        for turn in store.get(name).turns:
            reply = render_turn(turn, conversation(0), random.Random(7))
            used |= {call.name for call in reply.tool_calls}
    # Registry tools of the MCP sandbox desk (server ids desk and vault), not of the catalogue.
    used -= {"desk__list_tickets", "desk__create_ticket", "desk__add_note", "vault__list_tickets"}
    # Deliberate unknown tools: bad_tool's, and the injection scenarios' attempts at tools
    # a lead-triage agent does not have (least privilege). Registry tools (issue 18) are
    # not built-ins: the tests that call them add them to their workspace first (the shop's
    # by importing its OpenAPI document; petstore's listPets, from the Petstore document).
    # obey_supplier's and pay_input's (tests/integration/test_provenance.py): a page fetch,
    # a DM, a transfer.
    registry = {"channel_history", "charge_customer", "listPets"} | SHOP_TOOLS
    registry |= {"fetch_page", "chat_dm", "pay_supplier"}
    assert used - CATALOGUE - registry == {
        "delete_everything",
        "list_invoices",
        "crm_export_contacts",
    }


@pytest.mark.parametrize(
    "document",
    [[], {"turns": []}, {"turns": [{}]}, {"turns": [{"content": "x"}], "latency_ms": [5, 1]}],
)
def test_malformed_scenarios_are_rejected(document: Any) -> None:
    with pytest.raises(ScenarioError):
        parse_scenario("broken", document)


def test_the_server_runs_as_a_process_on_a_free_port(tmp_path: Path) -> None:
    port_file = tmp_path / "model.port"
    command = [
        sys.executable,
        "-m",
        "sandbox",
        "model",
        "--port",
        "0",
        "--port-file",
        str(port_file),
    ]
    process = subprocess.Popen(command, cwd=REPO, stderr=subprocess.PIPE)
    try:
        port = _wait_for_port(port_file, process, deadline=time.monotonic() + 20)
        response = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "demo", "messages": conversation(0)},
            timeout=5,
        )
        assert response.status_code == 200
        assert tool_calls(response)[0]["name"] == "crm_lookup"
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=10)
    assert process.returncode == 0, stderr.decode()


def _wait_for_port(port_file: Path, process: subprocess.Popen, deadline: float) -> int:
    while time.monotonic() < deadline:
        if port_file.exists():
            return int(port_file.read_text())
        assert process.poll() is None, "sandbox exited before it was ready"
        time.sleep(0.02)
    raise AssertionError(f"{port_file} did not appear in time")
