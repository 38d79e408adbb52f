"""The model sandbox's Anthropic Messages endpoint refuses what the real API refuses,
answers in its shapes, and plays the same scenario files as chat completions."""

import warnings
from typing import Any

import pytest
from starlette.exceptions import StarletteDeprecationWarning

from sandbox.model_server import create_app

with warnings.catch_warnings():
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

HEADERS = {"anthropic-version": "2023-06-01", "x-api-key": "sk-a"}
USE = {"type": "tool_use", "id": "toolu_1", "name": "echo", "input": {"text": "x"}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "x"}


@pytest.fixture
def client() -> TestClient:
    return TestClient(create_app(api_key="sk-a"))


def send(client: TestClient, headers: dict[str, str] = HEADERS, **body: Any):
    request = {
        "model": "demo",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"}],
        **body,
    }
    return client.post("/v1/messages", json=request, headers=headers)


def test_an_answer_in_the_messages_shape(client: TestClient) -> None:
    reply = send(client).json()
    assert reply["type"] == "message" and reply["role"] == "assistant"
    assert reply["stop_reason"] == "tool_use"
    [call] = reply["content"]
    assert (call["type"], call["name"], call["input"]) == (
        "tool_use",
        "crm_lookup",
        {"email": "ada@example.com"},
    )
    usage = reply["usage"]
    assert set(usage) == {
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    }
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"messages": [{"role": "assistant", "content": "hi"}]}, "alternate"),
        (
            {
                "messages": [
                    {"role": "user", "content": "a"},
                    {"role": "assistant", "content": [USE]},
                    {"role": "user", "content": "no result"},
                ]
            },
            "without tool_result",
        ),
        ({"tools": [{"name": "echo"}]}, "input_schema"),
        (
            {"system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}] * 5},
            "maximum of 4",
        ),
    ],
)
def test_what_the_real_api_refuses_is_400(client: TestClient, change, message) -> None:
    response = send(client, **change)
    assert response.status_code == 400
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert message in body["error"]["message"]


def test_a_tool_use_answered_by_its_result_plays_the_next_turn(client: TestClient) -> None:
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": [USE]},
        {"role": "user", "content": [RESULT]},
    ]
    assert send(client, messages=messages).status_code == 200
    assert client.get("/_sandbox/requests").json()["requests"][-1]["turn"] == 1


def test_headers_and_key(client: TestClient) -> None:
    missing = send(client, headers={"x-api-key": "sk-a"})
    assert missing.status_code == 400 and "anthropic-version" in missing.json()["error"]["message"]
    wrong = send(client, headers={**HEADERS, "x-api-key": "nope"})
    assert wrong.status_code == 401
    assert wrong.json()["error"]["type"] == "authentication_error"


def test_a_fault_answers_in_anthropic_words(client: TestClient) -> None:
    client.post("/_sandbox/faults", json={"down": True, "status": 529, "count": 1})
    overloaded = send(client)
    assert overloaded.status_code == 529
    assert overloaded.json()["error"]["type"] == "overloaded_error"
    assert send(client).status_code == 200


def test_an_exhausted_quota_is_a_billing_error(client: TestClient) -> None:
    response = send(client, model="out_of_quota")
    assert response.status_code == 402
    assert response.json()["error"]["type"] == "billing_error"
    openai = client.post(
        "/v1/chat/completions",
        headers={"authorization": "Bearer sk-a"},
        json={"model": "out_of_quota", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert openai.status_code == 429
    assert openai.json()["error"]["code"] == "insufficient_quota"
