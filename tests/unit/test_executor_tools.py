"""Tool requests over HTTP against a scripted server: URLs, bodies, keys, error shapes.

The outcomes by idempotency class are in test_tool_classes.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest

from executor.config import ExecutorConfig
from executor.tools.catalogue import Catalogue
from executor.tools.http_tool import HttpToolClient
from executor.tools.send_errors import MaybeSent, NotSent, ProviderError
from tests.harness.http_stub import CUT, DROP, STALL, Stub, full_backlog, reply, serving

CATALOGUE = Catalogue.load()
MAIL = {"to": "ada@example.com", "subject": "Hi", "body": "Hello"}


def config(url: str, timeout: float = 10.0) -> ExecutorConfig:
    return ExecutorConfig(
        providers_url=url, provider_urls={"crm": f"{url}/crm-base/"}, tool_timeout_seconds=timeout
    )


@contextlib.asynccontextmanager
async def provider(*script, refusing: bool = False) -> AsyncIterator[tuple[HttpToolClient, Stub]]:
    """A client of a server answering each request with the next item (the last repeats)."""
    left = list(script)
    async with serving(
        lambda seen: left.pop(0) if len(left) > 1 else left[0], refusing=refusing
    ) as stub:
        client = HttpToolClient(config(stub.url, timeout=0.5))
        try:
            yield client, stub
        finally:
            await client.aclose()


async def test_get_sends_arguments_as_query_to_the_providers_own_url():
    async with provider(reply(json={"name": "Ada"})) as (client, stub):
        tool = CATALOGUE.get("crm_lookup")
        assert await client.send(tool, {"email": "ada@example.com"}, "r:3") == {"name": "Ada"}
    request = stub.seen[0]
    assert (request.method, request.path) == ("GET", "/crm-base/crm/contacts")
    assert request.query == {"email": "ada@example.com"}
    assert request.headers["idempotency-key"] == "r:3"


async def test_post_sends_arguments_as_json_body():
    message = {"channel": "#sales", "text": "hi"}
    async with provider(reply(json={"ok": True})) as (client, stub):
        await client.send(CATALOGUE.get("chat_post"), message, "r:5")
    request = stub.seen[0]
    assert (request.method, request.target) == ("POST", "/chat/messages")
    assert request.json() == message and request.headers["content-type"] == "application/json"
    assert request.headers["idempotency-key"] == "r:5"


async def test_a_lookup_class_write_carries_its_key_stamped_into_the_body():
    async with provider(reply(json={"status": "sent"})) as (client, stub):
        await client.send(CATALOGUE.get("send_email"), MAIL, "r:5")
    request = stub.seen[0]
    assert (request.method, request.target) == ("POST", "/mail/send")
    assert request.json() == {**MAIL, "headers": {"X-Agentrun-Key": "r:5"}}


async def test_a_lookup_asks_for_the_stamped_key_and_returns_the_first_match():
    found = {"message_id": "m1", "headers": {"X-Agentrun-Key": "r:5"}}
    tool = CATALOGUE.get("send_email")
    script = (reply(json={"messages": [found]}), reply(json={"messages": []}))
    async with provider(*script) as (client, stub):
        assert await client.look_up(tool, "r:5") == found
        assert await client.look_up(tool, "r:5") is None
    request = stub.seen[0]
    assert request.path == "/mail/search"
    assert request.query == {"header": "X-Agentrun-Key", "value": "r:5"}


async def test_a_lookup_answer_without_its_list_is_a_provider_error():
    async with provider(reply(json={"unexpected": True})) as (client, _):
        with pytest.raises(ProviderError, match="messages"):
            await client.look_up(CATALOGUE.get("send_email"), "r:5")


@pytest.mark.parametrize(
    ("fault", "expected", "named"),
    [
        (DROP, MaybeSent, "ServerDisconnectedError"),
        (STALL, MaybeSent, "SocketTimeoutError"),
        (CUT, MaybeSent, "ClientPayloadError"),
    ],
)
async def test_a_request_that_was_written_and_then_broke_may_have_left(fault, expected, named):
    async with provider(fault) as (client, stub):
        with pytest.raises(expected, match=named):
            await client.send(CATALOGUE.get("echo"), {"text": "x"}, "r:1")
    assert len(stub.seen) == 1  # it arrived, and nothing sent it a second time


async def test_a_request_that_found_no_connection_never_left():
    async with provider(reply(json={}), refusing=True) as (client, stub):
        with pytest.raises(NotSent, match="ClientConnectorError"):  # connection refused
            await client.send(CATALOGUE.get("echo"), {"text": "x"}, "r:1")
    assert stub.seen == []
    with full_backlog() as url:  # the connection never completes: the connect timeout
        client = HttpToolClient(config(url, timeout=0.3))
        with pytest.raises(NotSent, match="ConnectionTimeoutError"):
            await client.send(CATALOGUE.get("echo"), {"text": "x"}, "r:1")
        await client.aclose()


async def test_http_errors_carry_status_message_and_retry_after():
    answer = reply(429, {"error": "slow"}, headers={"Retry-After": "3"})
    async with provider(answer) as (client, _):
        with pytest.raises(ProviderError) as err:
            await client.send(CATALOGUE.get("echo"), {"text": "x"}, "r:1")
    assert (err.value.status, err.value.message, err.value.retry_after) == (429, "slow", 3.0)
    assert err.value.retryable


def test_config_from_env_hides_the_key_and_routes_providers():
    config = ExecutorConfig.from_env(
        {
            "AGENTRUN_MODEL_API_KEY": "sk-very-secret",
            "AGENTRUN_PROVIDERS_URL": "http://p.test/",
            "AGENTRUN_PROVIDER_URL_MAIL": "http://mail.test",
            "AGENTRUN_CAPACITY": "4",
        }
    )
    assert "sk-very-secret" not in repr(config)
    assert config.model_api_key == "sk-very-secret"
    assert config.capacity == 4
    assert config.provider_url("mail") == "http://mail.test"
    assert config.provider_url("crm") == "http://p.test"
    assert config.control_plane == "127.0.0.1:50051"
    assert config.executor_id.count("-") >= 2
