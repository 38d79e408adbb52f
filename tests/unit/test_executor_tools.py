"""Tool requests and their outcomes by idempotency class, against an HTTP-level stand-in."""

from __future__ import annotations

import json

import httpx
import pytest

from executor.config import ExecutorConfig
from executor.tools.catalogue import Catalogue
from executor.tools.delivery import NOT_RETRIED, Outcome, ToolDelivery, classify
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


def delivery(provider: Provider) -> ToolDelivery:
    return ToolDelivery(client(provider), attempts=3, initial_wait=0, max_wait=0)


def safe() -> None:
    pass


async def test_get_sends_arguments_as_query_to_the_providers_own_url():
    provider = Provider(httpx.Response(200, json={"name": "Ada"}))
    tool = CATALOGUE.get("crm_lookup")
    assert await client(provider).send(tool, {"email": "ada@example.com"}, "r:3") == {"name": "Ada"}
    request = provider.requests[0]
    assert request.method == "GET"
    assert str(request.url) == "http://crm.test/crm/contacts?email=ada%40example.com"
    assert request.headers["idempotency-key"] == "r:3"


async def test_post_sends_arguments_as_json_body():
    provider = Provider(httpx.Response(200, json={"status": "sent"}))
    await client(provider).send(CATALOGUE.get("send_email"), MAIL, "r:5")
    request = provider.requests[0]
    assert (request.method, str(request.url)) == ("POST", "http://providers.test/mail/send")
    assert json.loads(request.content) == MAIL


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


async def test_read_is_retried_through_5xx_and_timeouts():
    provider = Provider(
        httpx.Response(503, json={"error": "busy"}),
        httpx.ReadTimeout,
        httpx.Response(200, json={"echo": "x"}),
    )
    outcome = await delivery(provider).send(CATALOGUE.get("echo"), {"text": "x"}, "r:1", safe)
    assert outcome == Outcome("ok", output={"echo": "x"})
    assert provider.keys == ["r:1", "r:1", "r:1"]


async def test_read_that_keeps_failing_is_an_error_after_a_few_tries():
    provider = Provider(httpx.Response(503, json={"error": "busy"}))
    outcome = await delivery(provider).send(CATALOGUE.get("echo"), {"text": "x"}, "r:1", safe)
    assert outcome.status == "error"
    assert "503" in outcome.error and "3 attempts" in outcome.error
    assert len(provider.requests) == 3


async def test_client_error_is_not_retried_and_the_model_sees_the_message():
    provider = Provider(httpx.Response(404, json={"error": "no contact"}))
    tool = CATALOGUE.get("crm_lookup")
    outcome = await delivery(provider).send(tool, {"email": "x@y.z"}, "r:1", safe)
    assert outcome == Outcome("error", error="provider returned 404: no contact")
    assert len(provider.requests) == 1


async def test_write_without_key_is_not_resent_after_a_timeout():
    provider = Provider(httpx.ReadTimeout, httpx.Response(200, json={}))
    outcome = await delivery(provider).send(CATALOGUE.get("send_email"), MAIL, "r:4", safe)
    assert outcome.status == "unknown"
    assert outcome.resolution.startswith(NOT_RETRIED)
    assert len(provider.requests) == 1


async def test_write_without_key_is_resent_when_it_never_left():
    provider = Provider(httpx.ConnectError, httpx.Response(200, json={"status": "sent"}))
    outcome = await delivery(provider).send(CATALOGUE.get("send_email"), MAIL, "r:4", safe)
    assert outcome == Outcome("ok", output={"status": "sent"})
    assert provider.keys == ["r:4", "r:4"]


async def test_unknown_write_without_key_is_not_sent_on_resume():
    provider = Provider(httpx.Response(200, json={}))
    tool = CATALOGUE.get("send_email")
    outcome = await delivery(provider).resolve_unknown(tool, "none", MAIL, "r:4", safe)
    assert outcome == Outcome("unknown", resolution=NOT_RETRIED)
    assert provider.requests == []


async def test_unknown_read_is_sent_again_with_the_same_key_on_resume():
    provider = Provider(httpx.Response(200, json={"echo": "x"}))
    tool = CATALOGUE.get("echo")
    outcome = await delivery(provider).resolve_unknown(tool, "read", {"text": "x"}, "r:2", safe)
    assert outcome.status == "ok"
    assert provider.keys == ["r:2"]


async def test_guard_stops_the_send_when_the_lease_is_not_safe():
    class Fenced(Exception):
        pass

    def unsafe() -> None:
        raise Fenced

    provider = Provider(httpx.Response(200, json={}))
    with pytest.raises(Fenced):
        await delivery(provider).send(CATALOGUE.get("send_email"), MAIL, "r:4", unsafe)
    assert provider.requests == []


def test_classify_by_class():
    maybe = MaybeSent("no response from mail: ReadTimeout")
    assert classify("read", maybe, 3).status == "error"
    assert classify("none", maybe, 1).status == "unknown"
    keyed = classify("provider_key", maybe, 3)
    assert keyed.status == "unknown" and "same idempotency key" in keyed.resolution
    assert classify("none", ProviderError(500, "boom"), 1).status == "unknown"
    assert classify("none", ProviderError(400, "bad"), 1).status == "error"
    assert classify("none", ProviderError(429, "slow"), 3).status == "error"
    assert classify("none", NotSent("could not connect"), 3).status == "error"


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
