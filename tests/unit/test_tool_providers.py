"""The sandbox providers' semantics, faithful to the real APIs, and faults per endpoint and call."""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import httpx
import pytest
from starlette.exceptions import StarletteDeprecationWarning

from sandbox.faults import ConnectionDropped
from sandbox.providers import create_app
from sandbox.providers.base import Processing, ProviderRequest
from sandbox.providers.payments import DECLINED_CUSTOMER, PaymentsProvider

with warnings.catch_warnings():
    # starlette 1.x would rather its test client ran on httpx2; we pin httpx.
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

CHARGE = {"amount": 4900, "currency": "usd", "customer": "cus_1", "description": "Plan"}
MAIL = {"to": "ada@example.com", "subject": "Receipt", "body": "Thanks"}
POST = {"channel": "#sales", "text": "Ada charged"}


@pytest.fixture
def client() -> TestClient:
    return TestClient(create_app())


def call(client: TestClient, path: str, body: Any, key: str | None = None) -> httpx.Response:
    return client.post(path, json=body, headers={"Idempotency-Key": key} if key else {})


def effects(client: TestClient, provider: str) -> list[dict[str, Any]]:
    return client.get("/_sandbox/effects", params={"provider": provider}).json()["effects"]


def arm(client: TestClient, **spec: Any) -> None:
    response = client.post("/_sandbox/faults", json=spec)
    assert response.status_code == 200, response.text


# -- payments: Idempotency-Key as Stripe does it ------------------------------------------------


def test_the_same_key_and_body_replays_the_first_charge_and_charges_once(client):
    first = call(client, "/payments/charges", CHARGE, "run:4")
    again = call(client, "/payments/charges", CHARGE, "run:4")
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json() and again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert [e["key"] for e in effects(client, "payments")] == ["run:4"]


def test_the_same_key_with_another_body_is_refused(client):
    call(client, "/payments/charges", CHARGE, "run:4")
    other = call(client, "/payments/charges", {**CHARGE, "amount": 1}, "run:4")
    assert other.status_code == 400
    assert other.json()["error"]["code"] == "idempotency_key_reused"
    assert len(effects(client, "payments")) == 1


def test_without_a_key_every_request_charges(client):
    call(client, "/payments/charges", CHARGE)
    call(client, "/payments/charges", CHARGE)
    assert len(effects(client, "payments")) == 2


def test_a_declined_card_is_saved_with_the_key_and_replayed(client):
    declined = {**CHARGE, "customer": DECLINED_CUSTOMER}
    first = call(client, "/payments/charges", declined, "run:4")
    again = call(client, "/payments/charges", declined, "run:4")
    assert first.status_code == again.status_code == 402
    assert again.headers["idempotent-replayed"] == "true"
    assert effects(client, "payments") == []


def test_a_request_failing_validation_is_not_saved_with_its_key(client):
    assert call(client, "/payments/charges", {**CHARGE, "amount": -5}, "run:4").status_code == 400
    assert call(client, "/payments/charges", CHARGE, "run:4").status_code == 200


def request(key: str, processing: Processing | None = None) -> ProviderRequest:
    return ProviderRequest(
        "POST",
        "/payments/charges",
        {},
        {"idempotency-key": key},
        CHARGE,
        processing or Processing(),
    )


class Held(Processing):
    """Processing that lasts until the test lets it finish."""

    def __init__(self) -> None:
        super().__init__()
        self.reached, self.release = asyncio.Event(), asyncio.Event()

    async def wait(self) -> None:
        self.reached.set()
        await self.release.wait()


async def test_a_key_still_in_flight_gets_a_conflict_then_the_replay():
    payments, held = PaymentsProvider(), Held()
    first = asyncio.create_task(payments.create_charge(request("run:4", held)))
    await held.reached.wait()
    conflict = await payments.create_charge(request("run:4"))
    assert conflict.status_code == 409 and b"idempotency_key_in_use" in conflict.body
    held.release.set()
    assert (await first).status_code == 200
    replay = await payments.create_charge(request("run:4"))
    assert replay.headers["idempotent-replayed"] == "true" and len(payments.charges) == 1


async def test_a_key_past_its_retention_is_forgotten_and_charges_again():
    now = [1000.0]
    payments = PaymentsProvider(retention_seconds=60, clock=lambda: now[0])
    await payments.create_charge(request("run:4"))
    now[0] += 59
    assert (await payments.create_charge(request("run:4"))).headers["idempotent-replayed"]
    now[0] += 2
    fresh = await payments.create_charge(request("run:4"))
    assert "idempotent-replayed" not in fresh.headers and len(payments.charges) == 2


# -- mail: no dedupe, but a stamped header to look up ------------------------------------------


def test_a_sent_message_is_found_by_the_header_its_sender_stamped(client):
    stamped = {**MAIL, "headers": {"X-Agentrun-Key": "run:6"}}
    sent = call(client, "/mail/send", stamped, "run:6").json()
    found = client.get("/mail/search", params={"header": "x-agentrun-key", "value": "run:6"})
    (message,) = found.json()["messages"]
    assert message["message_id"] == sent["message_id"] and message["subject"] == "Receipt"
    missing = client.get("/mail/search", params={"header": "X-Agentrun-Key", "value": "run:7"})
    assert missing.json() == {"messages": []}


def test_mail_does_not_deduplicate_the_same_send(client):
    call(client, "/mail/send", MAIL, "run:6")
    call(client, "/mail/send", MAIL, "run:6")
    assert [e["key"] for e in effects(client, "mail")] == ["run:6", "run:6"]


def test_a_thread_is_read_oldest_first_and_a_reply_joins_it(client):
    (received,) = client.get("/mail/search", params={"query": "invoice"}).json()["messages"]
    reply = {**MAIL, "thread_id": received["thread_id"]}
    assert call(client, "/mail/send", reply).status_code == 200
    thread = client.get("/mail/thread", params={"thread_id": received["thread_id"]}).json()
    assert [m["subject"] for m in thread["messages"]] == ["Question about my invoice", "Receipt"]
    assert call(client, "/mail/send", {**MAIL, "thread_id": "nope"}).status_code == 404
    assert client.get("/mail/thread", params={"thread_id": "nope"}).status_code == 404
    assert client.get("/mail/search").status_code == 400


# -- chat: neither key nor lookup; crm: idempotent upserts ------------------------------------


def test_chat_posts_the_same_request_twice(client):
    first = call(client, "/chat/messages", POST, "run:8").json()
    call(client, "/chat/messages", POST, "run:8")
    assert first["ok"] is True and first["channel"] == "#sales"
    assert [e["key"] for e in effects(client, "chat")] == ["run:8", "run:8"]
    assert call(client, "/chat/messages", {**POST, "channel": "sales"}).status_code == 404


def test_an_upsert_applied_twice_changes_the_contact_once(client):
    contact = {"email": "Lin@example.com", "name": "Lin", "stage": "lead"}
    first = call(client, "/crm/contacts/upsert", contact, "run:2").json()
    again = call(client, "/crm/contacts/upsert", contact, "run:2").json()
    assert (first["created"], first["changed"]) == (True, True)
    assert (again["created"], again["changed"]) == (False, False)
    assert again["contact"] == {"email": "lin@example.com", "name": "Lin", "stage": "lead"}
    update = call(client, "/crm/contacts/upsert", {"email": "lin@example.com", "stage": "customer"})
    assert update.json()["changed"] is True
    assert client.get("/crm/contacts", params={"email": "lin@example.com"}).json()["stage"] == (
        "customer"
    )
    assert [e["created"] for e in effects(client, "crm")] == [True, False]
    assert call(client, "/crm/contacts/upsert", {**contact, "stage": "vip"}).status_code == 400


# -- faults per endpoint and per call ---------------------------------------------------------


def test_a_fault_for_one_endpoint_spares_the_others(client):
    arm(client, provider="mail", mode="error", path="/mail/send")
    assert call(client, "/mail/send", MAIL).status_code == 503
    assert client.get("/mail/search", params={"query": "invoice"}).status_code == 200


def test_a_fault_for_one_runs_calls_spares_other_runs(client):
    arm(client, provider="chat", mode="error", key_prefix="run-a:")
    assert call(client, "/chat/messages", POST, "run-b:3").status_code == 200
    assert call(client, "/chat/messages", POST, "run-a:3").status_code == 503


def test_a_fault_after_n_calls_hits_the_next_count_calls(client):
    arm(client, provider="chat", mode="error", after=1, count=2)
    codes = [call(client, "/chat/messages", POST).status_code for _ in range(4)]
    assert codes == [200, 503, 503, 200]
    assert client.get("/_sandbox/faults").json() == {"faults": {}}


def test_a_seeded_random_fault_hits_a_repeatable_fraction(client):
    def hits() -> list[int]:
        client.delete("/_sandbox/faults")
        arm(client, provider="chat", mode="error", probability=0.3, seed=11)
        return [call(client, "/chat/messages", POST).status_code for _ in range(40)]

    first = hits()
    assert first == hits() and 4 <= first.count(503) <= 20


def test_a_dropped_response_after_the_charge_is_answered_by_the_replay(client):
    arm(client, provider="payments", mode="drop_response", delay_ms=0, count=1)
    with pytest.raises(ConnectionDropped):
        call(client, "/payments/charges", CHARGE, "run:4")
    again = call(client, "/payments/charges", CHARGE, "run:4")
    assert again.headers["idempotent-replayed"] == "true" and len(effects(client, "payments")) == 1


def test_faults_are_disarmed_per_endpoint(client):
    arm(client, provider="mail", mode="error", path="/mail/send")
    arm(client, provider="mail", mode="delay", path="/mail/search", delay_ms=1)
    arm(client, provider="mail", mode="off", path="/mail/send")
    (left,) = client.get("/_sandbox/faults").json()["faults"]["mail"]
    assert left["path"] == "/mail/search"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"provider": "chat", "mode": "error", "probability": 0}, "probability"),
        ({"provider": "chat", "mode": "error", "after": -1}, "after"),
        ({"provider": "chat", "mode": "error", "path": ""}, "path"),
        ({"provider": "chat", "mode": "error", "seed": "x"}, "seed"),
    ],
)
def test_bad_per_call_fault_specs_are_400(client, spec, field):
    response = client.post("/_sandbox/faults", json=spec)
    assert response.status_code == 400 and field in response.json()["error"]
