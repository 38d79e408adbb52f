"""Each idempotency class, at the HTTP level: what is sent again, asked, parked or left to a person.

A scripted HTTP server stands in for the providers (answers per path, the last one
repeating; faults played on the real connection); sleeps are recorded, never waited.
"""

from __future__ import annotations

import random

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
from executor.tools.http_tool import HttpToolClient
from executor.tools.send_errors import MaybeSent, NotSent, ProviderError
from tests.harness.http_stub import DROP, STALL, Reply, Stub, reply, scripted

CATALOGUE = Catalogue.load()
# A never-answered request is given up after this long (a lost answer).
TIMEOUT = 0.3
REFUSED = "refused"  # the connection is refused (nothing listens until the next attempt)
READ, CHARGE = CATALOGUE.get("echo"), CATALOGUE.get("create_charge")
MAIL, CHAT = CATALOGUE.get("send_email"), CATALOGUE.get("chat_post")
ECHO_ARGS = {"text": "x"}
CHARGE_ARGS = {"amount": 4900, "currency": "usd", "customer": "cus_1"}
MAIL_ARGS = {"to": "ada@example.com", "subject": "Hi", "body": "Hello"}
CHAT_ARGS = {"channel": "#sales", "text": "hi"}
DAY = 24 * 3600.0


def ok(body: object = None) -> Reply:
    return reply(json=body if body is not None else {"ok": True})


def status(code: int, **headers: str) -> Reply:
    return reply(code, {"error": {"message": f"status {code}"}}, headers=headers)


def found(*messages: dict) -> Reply:
    return reply(json={"messages": list(messages)})


# Short names for the endpoints a test scripts.
PATHS = {
    "echo": "/echo",
    "charges": "/payments/charges",
    "send": "/mail/send",
    "search": "/mail/search",
    "post": "/chat/messages",
}


class Setup:
    """A delivery whose provider endpoints answer as scripted: `Setup(send=[...], search=[...])`;
    `async with` it, the server runs. A script that starts with REFUSED has the server refuse
    connections until the delivery's first wait."""

    def __init__(self, **scripts: list) -> None:
        by_path = {PATHS[name]: items for name, items in scripts.items()}
        refusing = any(items[0] == REFUSED for items in by_path.values())
        for items in by_path.values():
            if items[0] == REFUSED:
                items.pop(0)
        self.stub = Stub(scripted(by_path), refusing=refusing)
        self.slept: list[float] = []
        config = ExecutorConfig(providers_url=self.stub.url, tool_timeout_seconds=TIMEOUT)
        self.client = HttpToolClient(config)
        self.delivery = ToolDelivery(
            self.client, attempts=3, initial_wait=0, max_wait=0, sleep=self.sleep
        )

    async def __aenter__(self) -> Setup:
        await self.stub.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.aclose()
        await self.stub.__aexit__()

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        await self.stub.listen()

    def keys(self, path: str) -> list[str]:
        return [r.headers["idempotency-key"] for r in self.stub.of(path)]

    def bodies(self, path: str) -> list[dict]:
        return [r.json() for r in self.stub.of(path)]

    @property
    def requests(self) -> list:
        return self.stub.seen


def guard() -> None:
    pass


# -- read -------------------------------------------------------------------------------------


async def test_a_read_is_retried_through_5xx_and_timeouts_with_the_same_key():
    async with Setup(echo=[status(503), STALL, ok({"echo": "x"})]) as s:
        outcome = await s.delivery.send(READ, ECHO_ARGS, "r:1", guard)
        assert outcome == Outcome("ok", output={"echo": "x"})
        assert s.keys("/echo") == ["r:1"] * 3


async def test_the_waits_between_sends_grow_exponentially_with_jitter_up_to_the_cap():
    async with Setup(
        echo=[status(503), status(503), status(503), status(503), ok({"echo": "x"})]
    ) as s:
        s.delivery = ToolDelivery(
            s.client, attempts=5, initial_wait=0.2, max_wait=1.0, sleep=s.sleep
        )
        outcome = await s.delivery.send(READ, ECHO_ARGS, "r:1", guard)
        assert outcome == Outcome("ok", output={"echo": "x"})
        assert s.keys("/echo") == ["r:1"] * 5
        # 0.2 x 2^(n-1) plus up to 0.2 of jitter after the nth send, never over 1.0.
        assert len(s.slept) == 4
        for n, (low, high) in enumerate([(0.2, 0.4), (0.4, 0.6), (0.8, 1.0), (1.0, 1.0)]):
            assert low <= s.slept[n] <= high, (n + 1, s.slept)


async def test_a_read_that_keeps_failing_parks_and_in_the_end_is_an_error():
    async with Setup(echo=[status(503)]) as s:
        outcome = await s.delivery.send(READ, ECHO_ARGS, "r:1", guard)
        assert outcome.status == "pending" and len(s.requests) == 3
        assert after_parks(outcome, MAX_PENDING_PARKS - 1) is outcome
        final = after_parks(outcome, MAX_PENDING_PARKS)
        assert final.status == "error" and "503" in final.error and "3 attempts" in final.error


async def test_a_refused_read_is_an_error_at_once_that_the_model_reads():
    async with Setup(echo=[reply(404, {"error": "no contact"})]) as s:
        outcome = await s.delivery.send(READ, ECHO_ARGS, "r:1", guard)
        assert outcome == Outcome("error", error="provider returned 404: no contact")
        assert len(s.requests) == 1


# -- provider_key -----------------------------------------------------------------------------


async def test_a_keyed_write_whose_answer_was_lost_is_sent_again_with_the_same_key():
    async with Setup(charges=[DROP, ok({"id": "ch_1"})]) as s:
        outcome = await s.delivery.send(CHARGE, CHARGE_ARGS, "r:4", guard)
        assert outcome == Outcome("ok", output={"id": "ch_1"})
        assert s.keys("/payments/charges") == ["r:4", "r:4"]


async def test_a_key_still_in_use_is_sent_again_later_with_the_same_key():
    async with Setup(charges=[status(409), status(409), ok({"id": "ch_1"})]) as s:
        outcome = await s.delivery.send(CHARGE, CHARGE_ARGS, "r:4", guard)
        assert outcome.status == "ok"
        assert s.keys("/payments/charges") == ["r:4"] * 3


async def test_a_key_that_stays_in_use_parks_the_run_and_in_the_end_asks_a_person():
    async with Setup(charges=[status(409, **{"retry-after": "7"})]) as s:
        outcome = await s.delivery.send(CHARGE, CHARGE_ARGS, "r:4", guard)
        assert (outcome.status, outcome.retry_after) == ("pending", 7.0)
        assert "still in use" in outcome.resolution
        assert after_parks(outcome, MAX_PENDING_PARKS).status == "unknown"


async def test_a_keyed_write_never_answered_parks_to_send_the_same_key_later():
    async with Setup(charges=[STALL]) as s:
        outcome = await s.delivery.send(CHARGE, CHARGE_ARGS, "r:4", guard)
        assert outcome.status == "pending" and "same idempotency key" in outcome.resolution
        fallback = after_parks(outcome, MAX_PENDING_PARKS)
        assert fallback.status == "unknown" and fallback.resolution.endswith(ASK_A_PERSON)


async def test_a_declined_card_is_an_error_and_is_not_sent_again():
    async with Setup(charges=[status(402)]) as s:
        outcome = await s.delivery.send(CHARGE, CHARGE_ARGS, "r:4", guard)
        assert outcome == Outcome("error", error="provider returned 402: status 402")
        assert len(s.requests) == 1


async def test_on_resume_a_keyed_write_is_sent_again_with_its_key():
    async with Setup(charges=[ok({"id": "ch_1"})]) as s:
        outcome = await s.delivery.resolve_unknown(
            CHARGE, "provider_key", CHARGE_ARGS, "r:4", guard
        )
        assert outcome.status == "ok" and s.keys("/payments/charges") == ["r:4"]


async def test_on_resume_a_key_past_its_retention_is_not_sent_and_a_person_decides():
    async with Setup(charges=[ok()]) as s:
        delivery = s.delivery
        outcome = await delivery.resolve_unknown(
            CHARGE, "provider_key", CHARGE_ARGS, "r:4", guard, key_age=DAY + 1
        )
        assert outcome.status == "unknown" and "keeps keys 24 h" in outcome.resolution
        assert s.requests == []


# -- lookup -----------------------------------------------------------------------------------


async def test_a_lost_answer_is_found_by_lookup_and_not_sent_again():
    message = {"message_id": "m1", "headers": {"X-Agentrun-Key": "r:6"}}
    async with Setup(send=[DROP], search=[found(message)]) as s:
        outcome = await s.delivery.send(MAIL, MAIL_ARGS, "r:6", guard)
        assert (outcome.status, outcome.output) == ("ok", message)
        assert "lookup" in outcome.resolution
        assert s.keys("/mail/send") == ["r:6"] and s.keys("/mail/search") == ["r:6"]
        assert s.slept == [MAIL.lookup.settle_seconds]  # let the lost request land first


async def test_what_the_lookup_did_not_find_is_sent_again_stamped_with_the_same_key():
    async with Setup(send=[STALL, ok({"status": "sent"})], search=[found()]) as s:
        outcome = await s.delivery.send(MAIL, MAIL_ARGS, "r:6", guard)
        assert outcome == Outcome("ok", output={"status": "sent"})
        stamped = {**MAIL_ARGS, "headers": {"X-Agentrun-Key": "r:6"}}
        assert s.bodies("/mail/send") == [stamped, stamped]


async def test_a_lookup_that_cannot_be_asked_parks_the_run():
    async with Setup(send=[STALL], search=[status(503)]) as s:
        outcome = await s.delivery.send(MAIL, MAIL_ARGS, "r:6", guard)
        assert outcome.status == "pending" and "could not ask mail" in outcome.resolution
        assert len(s.keys("/mail/send")) == 1  # never sent blind
        assert after_parks(outcome, MAX_PENDING_PARKS).status == "unknown"


async def test_sends_never_answered_and_never_found_park_then_ask_a_person():
    async with Setup(send=[STALL], search=[found()]) as s:
        outcome = await s.delivery.send(MAIL, MAIL_ARGS, "r:6", guard)
        assert outcome.status == "pending"
        assert len(s.keys("/mail/send")) == 3 == len(s.keys("/mail/search"))
        assert after_parks(outcome, MAX_PENDING_PARKS).status == "unknown"


async def test_a_refused_lookup_class_write_is_an_error_without_a_lookup():
    async with Setup(send=[status(400)], search=[found()]) as s:
        outcome = await s.delivery.send(MAIL, MAIL_ARGS, "r:6", guard)
        assert outcome.status == "error" and s.keys("/mail/search") == []


async def test_on_resume_a_lookup_class_write_found_is_not_sent():
    async with Setup(send=[ok()], search=[found({"message_id": "m1"})]) as s:
        outcome = await s.delivery.resolve_unknown(MAIL, "lookup", MAIL_ARGS, "r:6", guard)
        assert outcome.output == {"message_id": "m1"} and s.keys("/mail/send") == []


async def test_on_resume_a_lookup_class_write_not_found_is_sent_once():
    async with Setup(send=[ok({"status": "sent"})], search=[found()]) as s:
        outcome = await s.delivery.resolve_unknown(MAIL, "lookup", MAIL_ARGS, "r:6", guard)
        assert outcome.status == "ok" and s.keys("/mail/send") == ["r:6"]


async def test_on_resume_a_lookup_key_past_retention_is_neither_asked_nor_sent():
    async with Setup(send=[ok()], search=[found()]) as s:
        age = 721 * 3600.0
        outcome = await s.delivery.resolve_unknown(MAIL, "lookup", MAIL_ARGS, "r:6", guard, age)
        assert outcome.status == "unknown" and s.requests == []


# -- none -------------------------------------------------------------------------------------


@pytest.mark.parametrize("failure", [STALL, DROP, status(500)])
async def test_a_write_without_key_or_lookup_is_never_sent_twice_and_a_person_decides(failure):
    async with Setup(post=[failure, ok()]) as s:
        outcome = await s.delivery.send(CHAT, CHAT_ARGS, "r:8", guard)
        assert outcome.status == "unknown" and outcome.resolution.startswith(NOT_RETRIED)
        assert outcome.resolution.endswith(ASK_A_PERSON)
        assert len(s.requests) == 1


async def test_a_write_that_never_left_is_sent_again_whatever_its_class():
    async with Setup(post=[REFUSED, ok({"ts": "1"})]) as s:
        outcome = await s.delivery.send(CHAT, CHAT_ARGS, "r:8", guard)
        assert outcome == Outcome("ok", output={"ts": "1"})
        # The first attempt found no connection (nothing arrived); the second went out.
        assert len(s.slept) == 1 and s.keys("/chat/messages") == ["r:8"]


async def test_a_rate_limited_write_is_sent_again_after_retry_after():
    async with Setup(post=[status(429, **{"retry-after": "2"}), ok()]) as s:
        outcome = await s.delivery.send(CHAT, CHAT_ARGS, "r:8", guard)
        assert outcome.status == "ok" and s.slept == [2.0]


async def test_a_write_that_stays_rate_limited_is_an_error_the_model_reads():
    async with Setup(post=[status(429)]) as s:
        outcome = await s.delivery.send(CHAT, CHAT_ARGS, "r:8", guard)
        assert outcome == Outcome("error", error="provider returned 429: status 429")


async def test_on_resume_a_write_without_key_or_lookup_is_not_sent():
    async with Setup(post=[ok()]) as s:
        outcome = await s.delivery.resolve_unknown(CHAT, "none", CHAT_ARGS, "r:8", guard)
        assert outcome == Outcome.unknown(NOT_RETRIED) and s.requests == []


async def test_the_guard_stops_any_request_under_an_unsafe_lease():
    class Fenced(Exception):
        pass

    def unsafe() -> None:
        raise Fenced

    async with Setup(post=[ok()], send=[ok()]) as s:
        with pytest.raises(Fenced):
            await s.delivery.send(CHAT, CHAT_ARGS, "r:8", unsafe)
        with pytest.raises(Fenced):
            await s.delivery.resolve_unknown(MAIL, "lookup", MAIL_ARGS, "r:6", unsafe)
        assert s.requests == []


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
