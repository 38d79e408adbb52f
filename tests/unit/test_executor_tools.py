"""Tool requests over HTTP against a stand-in transport: URLs, bodies, keys, error shapes.

The outcomes by idempotency class are in test_tool_classes.py.
"""

from __future__ import annotations

import json

import httpx
import pytest

from executor.config import ExecutorConfig
from executor.tools.catalogue import Catalogue
from executor.tools.http_tool import HttpToolClient, MaybeSent, NotSent, ProviderError

CATALOGUE = Catalogue.load()
MAIL = {"to": "ada@example.com", "subject": "Hi", "body": "Hello"}
CONFIG = ExecutorConfig(
    providers_url="http://providers.test", provider_urls={"crm": "http://crm.test/"}
)


class Provider:
    """Answers each request with the next scripted response (or raises it)."""

    def __init__(self, *script) -> None:
        self.script = list(script)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        item = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(item, type) and issubclass(item, Exception):
            raise item("scripted", request=request)
        return item

    @property
    def keys(self) -> list[str]:
        return [r.headers["idempotency-key"] for r in self.requests]


def client(provider: Provider) -> HttpToolClient:
    return HttpToolClient(CONFIG, transport=httpx.MockTransport(provider))


async def test_get_sends_arguments_as_query_to_the_providers_own_url():
    provider = Provider(httpx.Response(200, json={"name": "Ada"}))
    tool = CATALOGUE.get("crm_lookup")
    assert await client(provider).send(tool, {"email": "ada@example.com"}, "r:3") == {"name": "Ada"}
    request = provider.requests[0]
    assert request.method == "GET"
    assert str(request.url) == "http://crm.test/crm/contacts?email=ada%40example.com"
    assert request.headers["idempotency-key"] == "r:3"


async def test_post_sends_arguments_as_json_body():
    provider = Provider(httpx.Response(200, json={"ok": True}))
    message = {"channel": "#sales", "text": "hi"}
    await client(provider).send(CATALOGUE.get("chat_post"), message, "r:5")
    request = provider.requests[0]
    assert (request.method, str(request.url)) == ("POST", "http://providers.test/chat/messages")
    assert json.loads(request.content) == message
    assert request.headers["idempotency-key"] == "r:5"


async def test_a_lookup_class_write_carries_its_key_stamped_into_the_body():
    provider = Provider(httpx.Response(200, json={"status": "sent"}))
    await client(provider).send(CATALOGUE.get("send_email"), MAIL, "r:5")
    request = provider.requests[0]
    assert (request.method, str(request.url)) == ("POST", "http://providers.test/mail/send")
    assert json.loads(request.content) == {**MAIL, "headers": {"X-Agentrun-Key": "r:5"}}


async def test_a_lookup_asks_for_the_stamped_key_and_returns_the_first_match():
    found = {"message_id": "m1", "headers": {"X-Agentrun-Key": "r:5"}}
    provider = Provider(
        httpx.Response(200, json={"messages": [found]}), httpx.Response(200, json={"messages": []})
    )
    tool = CATALOGUE.get("send_email")
    assert await client(provider).look_up(tool, "r:5") == found
    assert await client(provider).look_up(tool, "r:5") is None
    request = provider.requests[0]
    assert str(request.url) == (
        "http://providers.test/mail/search?header=X-Agentrun-Key&value=r%3A5"
    )


async def test_a_lookup_answer_without_its_list_is_a_provider_error():
    provider = Provider(httpx.Response(200, json={"unexpected": True}))
    with pytest.raises(ProviderError, match="messages"):
        await client(provider).look_up(CATALOGUE.get("send_email"), "r:5")


@pytest.mark.parametrize(
    ("raised", "expected"),
    [(httpx.ConnectError, NotSent), (httpx.ConnectTimeout, NotSent),
     (httpx.ReadTimeout, MaybeSent), (httpx.RemoteProtocolError, MaybeSent),
     (httpx.WriteError, MaybeSent)],
)  # fmt: skip
async def test_transport_errors_say_whether_the_request_may_have_left(raised, expected):
    with pytest.raises(expected):
        await client(Provider(raised)).send(CATALOGUE.get("echo"), {"text": "x"}, "r:1")


async def test_http_errors_carry_status_message_and_retry_after():
    provider = Provider(httpx.Response(429, headers={"retry-after": "3"}, json={"error": "slow"}))
    with pytest.raises(ProviderError) as err:
        await client(provider).send(CATALOGUE.get("echo"), {"text": "x"}, "r:1")
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
