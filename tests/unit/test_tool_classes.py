"""Each idempotency class, at the HTTP level: what is sent again, asked, parked or left to a person.

A scripted transport stands in for the providers (answers per path, the last
one repeating); sleeps are recorded, never waited.
"""

from __future__ import annotations

import json
import random

import httpx
import pytest

from executor.config import ExecutorConfig
from executor.tools.catalogue import Catalogue
from executor.tools.delivery import (
    ASK_A_PERSON,
    MAX_PENDING_PARKS,
    NOT_RETRIED,
    Outcome,
    ToolDelivery,
    after_parks,
    pending_backoff,
)
from executor.tools.failures import Failure, classify, may_resend
from executor.tools.http_tool import HttpToolClient, MaybeSent, NotSent, ProviderError

CATALOGUE = Catalogue.load()
CONFIG = ExecutorConfig(providers_url="http://providers.test")
READ, CHARGE = CATALOGUE.get("echo"), CATALOGUE.get("create_charge")
MAIL, CHAT = CATALOGUE.get("send_email"), CATALOGUE.get("chat_post")
ECHO_ARGS = {"text": "x"}
CHARGE_ARGS = {"amount": 4900, "currency": "usd", "customer": "cus_1"}
MAIL_ARGS = {"to": "ada@example.com", "subject": "Hi", "body": "Hello"}
CHAT_ARGS = {"channel": "#sales", "text": "hi"}
DAY = 24 * 3600.0


def ok(body: object = None) -> httpx.Response:
    return httpx.Response(200, json=body if body is not None else {"ok": True})


def status(code: int, **headers: str) -> httpx.Response:
    return httpx.Response(code, headers=headers, json={"error": {"message": f"status {code}"}})


def found(*messages: dict) -> httpx.Response:
    return httpx.Response(200, json={"messages": list(messages)})


class Providers:
    """Answers each path with its next scripted item (the last one repeats)."""

    def __init__(self, scripts: dict[str, list]) -> None:
        self.scripts = {path: list(items) for path, items in scripts.items()}
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        script = self.scripts[request.url.path]
        item = script.pop(0) if len(script) > 1 else script[0]
        if isinstance(item, type) and issubclass(item, Exception):
            raise item("scripted", request=request)
        return item

    def keys(self, path: str) -> list[str]:
        return [r.headers["idempotency-key"] for r in self.requests if r.url.path == path]

    def bodies(self, path: str) -> list[dict]:
        return [json.loads(r.content) for r in self.requests if r.url.path == path]


# Short names for the endpoints a test scripts.
PATHS = {
    "echo": "/echo",
    "charges": "/payments/charges",
    "send": "/mail/send",
    "search": "/mail/search",
    "post": "/chat/messages",
}


class Setup:
    """A delivery whose provider endpoints answer as scripted: `Setup(send=[...], search=[...])`."""

    def __init__(self, **scripts: list) -> None:
        self.providers = Providers({PATHS[name]: items for name, items in scripts.items()})
        self.slept: list[float] = []
        client = HttpToolClient(CONFIG, transport=httpx.MockTransport(self.providers))
        self.delivery = ToolDelivery(
            client, attempts=3, initial_wait=0, max_wait=0, sleep=self.sleep
        )

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def guard() -> None:
    pass


# -- read -------------------------------------------------------------------------------------


async def test_a_read_is_retried_through_5xx_and_timeouts_with_the_same_key():
    s = Setup(echo=[status(503), httpx.ReadTimeout, ok({"echo": "x"})])
    outcome = await s.delivery.send(READ, ECHO_ARGS, "r:1", guard)
    assert outcome == Outcome("ok", output={"echo": "x"})
    assert s.providers.keys("/echo") == ["r:1"] * 3


async def test_a_read_that_keeps_failing_parks_and_in_the_end_is_an_error():
    s = Setup(echo=[status(503)])
    outcome = await s.delivery.send(READ, ECHO_ARGS, "r:1", guard)
    assert outcome.status == "pending" and len(s.providers.requests) == 3
    assert after_parks(outcome, MAX_PENDING_PARKS - 1) is outcome
    final = after_parks(outcome, MAX_PENDING_PARKS)
    assert final.status == "error" and "503" in final.error and "3 attempts" in final.error


async def test_a_refused_read_is_an_error_at_once_that_the_model_reads():
    s = Setup(echo=[httpx.Response(404, json={"error": "no contact"})])
    outcome = await s.delivery.send(READ, ECHO_ARGS, "r:1", guard)
    assert outcome == Outcome("error", error="provider returned 404: no contact")
    assert len(s.providers.requests) == 1


# -- provider_key -----------------------------------------------------------------------------


async def test_a_keyed_write_whose_answer_was_lost_is_sent_again_with_the_same_key():
    s = Setup(charges=[httpx.RemoteProtocolError, ok({"id": "ch_1"})])
    outcome = await s.delivery.send(CHARGE, CHARGE_ARGS, "r:4", guard)
    assert outcome == Outcome("ok", output={"id": "ch_1"})
    assert s.providers.keys("/payments/charges") == ["r:4", "r:4"]


async def test_a_key_still_in_use_is_sent_again_later_with_the_same_key():
    s = Setup(charges=[status(409), status(409), ok({"id": "ch_1"})])
    outcome = await s.delivery.send(CHARGE, CHARGE_ARGS, "r:4", guard)
    assert outcome.status == "ok"
    assert s.providers.keys("/payments/charges") == ["r:4"] * 3


async def test_a_key_that_stays_in_use_parks_the_run_and_in_the_end_asks_a_person():
    s = Setup(charges=[status(409, **{"retry-after": "7"})])
    outcome = await s.delivery.send(CHARGE, CHARGE_ARGS, "r:4", guard)
    assert (outcome.status, outcome.retry_after) == ("pending", 7.0)
    assert "still in use" in outcome.resolution
    assert after_parks(outcome, MAX_PENDING_PARKS).status == "unknown"


async def test_a_keyed_write_never_answered_parks_to_send_the_same_key_later():
    s = Setup(charges=[httpx.ReadTimeout])
    outcome = await s.delivery.send(CHARGE, CHARGE_ARGS, "r:4", guard)
    assert outcome.status == "pending" and "same idempotency key" in outcome.resolution
    fallback = after_parks(outcome, MAX_PENDING_PARKS)
    assert fallback.status == "unknown" and fallback.resolution.endswith(ASK_A_PERSON)


async def test_a_declined_card_is_an_error_and_is_not_sent_again():
    s = Setup(charges=[status(402)])
    outcome = await s.delivery.send(CHARGE, CHARGE_ARGS, "r:4", guard)
    assert outcome == Outcome("error", error="provider returned 402: status 402")
    assert len(s.providers.requests) == 1


async def test_on_resume_a_keyed_write_is_sent_again_with_its_key():
    s = Setup(charges=[ok({"id": "ch_1"})])
    outcome = await s.delivery.resolve_unknown(CHARGE, "provider_key", CHARGE_ARGS, "r:4", guard)
    assert outcome.status == "ok" and s.providers.keys("/payments/charges") == ["r:4"]


async def test_on_resume_a_key_past_its_retention_is_not_sent_and_a_person_decides():
    s = Setup(charges=[ok()])
    delivery = s.delivery
    outcome = await delivery.resolve_unknown(
        CHARGE, "provider_key", CHARGE_ARGS, "r:4", guard, key_age=DAY + 1
    )
    assert outcome.status == "unknown" and "keeps keys 24 h" in outcome.resolution
    assert s.providers.requests == []


# -- lookup -----------------------------------------------------------------------------------


async def test_a_lost_answer_is_found_by_lookup_and_not_sent_again():
    message = {"message_id": "m1", "headers": {"X-Agentrun-Key": "r:6"}}
    s = Setup(send=[httpx.RemoteProtocolError], search=[found(message)])
    outcome = await s.delivery.send(MAIL, MAIL_ARGS, "r:6", guard)
    assert (outcome.status, outcome.output) == ("ok", message)
    assert "lookup" in outcome.resolution
    assert s.providers.keys("/mail/send") == ["r:6"] and s.providers.keys("/mail/search") == ["r:6"]
    assert s.slept == [MAIL.lookup.settle_seconds]  # let the lost request land first


async def test_what_the_lookup_did_not_find_is_sent_again_stamped_with_the_same_key():
    s = Setup(send=[httpx.ReadTimeout, ok({"status": "sent"})], search=[found()])
    outcome = await s.delivery.send(MAIL, MAIL_ARGS, "r:6", guard)
    assert outcome == Outcome("ok", output={"status": "sent"})
    stamped = {**MAIL_ARGS, "headers": {"X-Agentrun-Key": "r:6"}}
    assert s.providers.bodies("/mail/send") == [stamped, stamped]


async def test_a_lookup_that_cannot_be_asked_parks_the_run():
    s = Setup(send=[httpx.ReadTimeout], search=[status(503)])
    outcome = await s.delivery.send(MAIL, MAIL_ARGS, "r:6", guard)
    assert outcome.status == "pending" and "could not ask mail" in outcome.resolution
    assert len(s.providers.keys("/mail/send")) == 1  # never sent blind
    assert after_parks(outcome, MAX_PENDING_PARKS).status == "unknown"


async def test_sends_never_answered_and_never_found_park_then_ask_a_person():
    s = Setup(send=[httpx.ReadTimeout], search=[found()])
    outcome = await s.delivery.send(MAIL, MAIL_ARGS, "r:6", guard)
    assert outcome.status == "pending"
    assert len(s.providers.keys("/mail/send")) == 3 == len(s.providers.keys("/mail/search"))
    assert after_parks(outcome, MAX_PENDING_PARKS).status == "unknown"


async def test_a_refused_lookup_class_write_is_an_error_without_a_lookup():
    s = Setup(send=[status(400)], search=[found()])
    outcome = await s.delivery.send(MAIL, MAIL_ARGS, "r:6", guard)
    assert outcome.status == "error" and s.providers.keys("/mail/search") == []


async def test_on_resume_a_lookup_class_write_found_is_not_sent():
    s = Setup(send=[ok()], search=[found({"message_id": "m1"})])
    outcome = await s.delivery.resolve_unknown(MAIL, "lookup", MAIL_ARGS, "r:6", guard)
    assert outcome.output == {"message_id": "m1"} and s.providers.keys("/mail/send") == []


async def test_on_resume_a_lookup_class_write_not_found_is_sent_once():
    s = Setup(send=[ok({"status": "sent"})], search=[found()])
    outcome = await s.delivery.resolve_unknown(MAIL, "lookup", MAIL_ARGS, "r:6", guard)
    assert outcome.status == "ok" and s.providers.keys("/mail/send") == ["r:6"]


async def test_on_resume_a_lookup_key_past_retention_is_neither_asked_nor_sent():
    s = Setup(send=[ok()], search=[found()])
    age = 721 * 3600.0
    outcome = await s.delivery.resolve_unknown(MAIL, "lookup", MAIL_ARGS, "r:6", guard, age)
    assert outcome.status == "unknown" and s.providers.requests == []


# -- none -------------------------------------------------------------------------------------


@pytest.mark.parametrize("failure", [httpx.ReadTimeout, httpx.RemoteProtocolError, status(500)])
async def test_a_write_without_key_or_lookup_is_never_sent_twice_and_a_person_decides(failure):
    s = Setup(post=[failure, ok()])
    outcome = await s.delivery.send(CHAT, CHAT_ARGS, "r:8", guard)
    assert outcome.status == "unknown" and outcome.resolution.startswith(NOT_RETRIED)
    assert outcome.resolution.endswith(ASK_A_PERSON)
    assert len(s.providers.requests) == 1


async def test_a_write_that_never_left_is_sent_again_whatever_its_class():
    s = Setup(post=[httpx.ConnectError, ok({"ts": "1"})])
    outcome = await s.delivery.send(CHAT, CHAT_ARGS, "r:8", guard)
    assert outcome == Outcome("ok", output={"ts": "1"})
    assert s.providers.keys("/chat/messages") == ["r:8", "r:8"]


async def test_a_rate_limited_write_is_sent_again_after_retry_after():
    s = Setup(post=[status(429, **{"retry-after": "2"}), ok()])
    outcome = await s.delivery.send(CHAT, CHAT_ARGS, "r:8", guard)
    assert outcome.status == "ok" and s.slept == [2.0]


async def test_a_write_that_stays_rate_limited_is_an_error_the_model_reads():
    s = Setup(post=[status(429)])
    outcome = await s.delivery.send(CHAT, CHAT_ARGS, "r:8", guard)
    assert outcome == Outcome("error", error="provider returned 429: status 429")


async def test_on_resume_a_write_without_key_or_lookup_is_not_sent():
    s = Setup(post=[ok()])
    outcome = await s.delivery.resolve_unknown(CHAT, "none", CHAT_ARGS, "r:8", guard)
    assert outcome == Outcome.unknown(NOT_RETRIED) and s.providers.requests == []


async def test_the_guard_stops_any_request_under_an_unsafe_lease():
    class Fenced(Exception):
        pass

    def unsafe() -> None:
        raise Fenced

    s = Setup(post=[ok()], send=[ok()])
    with pytest.raises(Fenced):
        await s.delivery.send(CHAT, CHAT_ARGS, "r:8", unsafe)
    with pytest.raises(Fenced):
        await s.delivery.resolve_unknown(MAIL, "lookup", MAIL_ARGS, "r:6", unsafe)
    assert s.providers.requests == []


# -- the classification -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "call_class", "failure"),
    [
        (NotSent("refused"), "none", Failure.NOT_SENT),
        (MaybeSent("timeout"), "read", Failure.MAYBE_APPLIED),
        (ProviderError(500, "boom"), "none", Failure.MAYBE_APPLIED),
        (ProviderError(429, "slow"), "none", Failure.RATE_LIMITED),
        (ProviderError(409, "in use"), "provider_key", Failure.KEY_IN_USE),
        (ProviderError(409, "conflict"), "none", Failure.REFUSED),
        (ProviderError(400, "bad"), "provider_key", Failure.REFUSED),
    ],
)
def test_failures_are_classified_by_whether_the_request_may_have_landed(error, call_class, failure):
    assert classify(error, call_class) is failure


@pytest.mark.parametrize(
    ("call_class", "resent"),
    [("read", True), ("provider_key", True), ("lookup", False), ("none", False)],
)
def test_only_reads_and_keyed_writes_are_sent_again_when_they_may_have_landed(call_class, resent):
    assert may_resend(call_class, Failure.MAYBE_APPLIED) is resent
    assert may_resend(call_class, Failure.NOT_SENT) and not may_resend(call_class, Failure.REFUSED)


def test_pending_backoff_grows_caps_and_honours_retry_after():
    rng = random.Random(1)
    assert 0.5 <= pending_backoff(0, None, rng) <= 1.0
    assert 150 <= pending_backoff(20, None, rng) <= 300
    assert pending_backoff(0, 42.0, rng) == 42.0
