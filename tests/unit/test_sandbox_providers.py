"""The provider sandbox: CRM, echo and mail behaviour, the request log, and per-provider faults."""

import time
import warnings
from typing import Any

import httpx
import pytest
from starlette.exceptions import StarletteDeprecationWarning
from starlette.responses import JSONResponse, Response

from sandbox.faults import ConnectionDropped
from sandbox.providers import PROVIDERS, create_app
from sandbox.providers.base import Endpoint, ProviderRequest
from sandbox.serve import BackgroundServer

with warnings.catch_warnings():
    # starlette 1.x would rather its test client ran on httpx2; we pin httpx.
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

MAIL = {"to": "ada@example.com", "subject": "Hello", "body": "Following up."}


@pytest.fixture
def client() -> TestClient:
    return TestClient(create_app())


def send_mail(client: TestClient, key: str | None = None, body: Any = MAIL):
    headers = {"Idempotency-Key": key} if key else {}
    return client.post("/mail/send", json=body, headers=headers)


def requests_log(client: TestClient) -> list[dict[str, Any]]:
    return client.get("/_sandbox/requests").json()["requests"]


def sent(client: TestClient) -> list[dict[str, Any]]:
    return client.get("/mail/sent").json()["messages"]


def arm(client: TestClient, **spec: Any) -> None:
    response = client.post("/_sandbox/faults", json=spec)
    assert response.status_code == 200, response.text


def test_crm_finds_a_known_contact(client: TestClient) -> None:
    response = client.get("/crm/contacts", params={"email": "ada@example.com"})
    assert response.status_code == 200
    assert response.json() == {
        "email": "ada@example.com",
        "name": "Ada Lovelace",
        "company": "Analytical Engines Ltd",
        "stage": "customer",
    }


def test_crm_unknown_contact_is_404(client: TestClient) -> None:
    response = client.get("/crm/contacts", params={"email": "nobody@example.com"})
    assert response.status_code == 404
    assert response.json() == {"error": "no contact"}
    assert client.get("/crm/contacts").status_code == 400


def test_echo_answers_with_its_text(client: TestClient) -> None:
    assert client.post("/echo", json={"text": "hi"}).json() == {"echo": "hi"}
    assert client.post("/echo", json={}).json() == {"error": "missing field: text"}


@pytest.mark.parametrize("field", ["to", "subject", "body"])
def test_mail_names_the_missing_field(client: TestClient, field: str) -> None:
    body = {k: v for k, v in MAIL.items() if k != field}
    response = send_mail(client, body=body)
    assert response.status_code == 400
    assert field in response.json()["error"]
    assert sent(client) == []


def test_mail_rejects_a_body_that_is_not_an_object(client: TestClient) -> None:
    response = client.post("/mail/send", content=b"[1, 2]")
    assert response.status_code == 400 and "object" in response.json()["error"]
    assert send_mail(client, body={**MAIL, "to": 7}).json() == {"error": "to must be a string"}


def test_mail_records_each_send_with_its_idempotency_key(client: TestClient) -> None:
    first = send_mail(client, key="run-1:3").json()
    assert first["status"] == "sent" and first["message_id"].endswith("@sandbox")
    send_mail(client, key="run-1:3")  # the sandbox does not dedupe: two sends
    send_mail(client)
    assert [m["idempotency_key"] for m in sent(client)] == ["run-1:3", "run-1:3", None]
    assert sent(client)[0]["message_id"] == first["message_id"]
    entry = requests_log(client)[0]
    assert entry | {"time": None} == {
        "n": 1,
        "time": None,
        "provider": "mail",
        "method": "POST",
        "path": "/mail/send",
        "query": {},
        "idempotency_key": "run-1:3",
        "body": MAIL,
        "status": 200,
        "fault": None,
    }


def test_every_provider_call_is_logged_but_inspection_is_not(client: TestClient) -> None:
    client.get("/crm/contacts", params={"email": "ada@example.com"})
    client.post("/echo", json={"text": "x"})
    send_mail(client, body={})
    sent(client)
    entries = requests_log(client)
    assert [(e["provider"], e["status"]) for e in entries] == [
        ("crm", 200),
        ("echo", 200),
        ("mail", 400),
    ]
    assert entries[0]["query"] == {"email": "ada@example.com"}


def test_clearing_the_log_forgets_sent_mail(client: TestClient) -> None:
    send_mail(client, key="k")
    assert client.delete("/_sandbox/requests").json() == {"requests": []}
    assert requests_log(client) == [] and sent(client) == []


def test_error_fault_answers_without_the_side_effect(client: TestClient) -> None:
    arm(client, provider="mail", mode="error", status=502, count=1)
    assert send_mail(client, key="k").status_code == 502
    assert sent(client) == []
    assert send_mail(client, key="k").status_code == 200  # count=1: the fault is used up
    log = requests_log(client)
    assert [(e["status"], e["fault"], e["idempotency_key"]) for e in log] == [
        (502, "error", "k"),
        (200, None, "k"),
    ]


def test_rate_limit_fault_is_429_with_retry_after(client: TestClient) -> None:
    arm(client, provider="mail", mode="rate_limit", retry_after=3)
    response = send_mail(client)
    assert response.status_code == 429 and response.headers["retry-after"] == "3"
    assert sent(client) == []
    # Other providers are not affected.
    assert client.post("/echo", json={"text": "x"}).status_code == 200


def test_delay_fault_answers_normally_but_late(client: TestClient) -> None:
    arm(client, provider="echo", mode="delay", delay_ms=50)
    started = time.monotonic()
    assert client.post("/echo", json={"text": "x"}).json() == {"echo": "x"}
    assert time.monotonic() - started >= 0.05


def test_drop_response_performs_the_side_effect_but_loses_the_answer(client: TestClient) -> None:
    arm(client, provider="mail", mode="drop_response", delay_ms=10, count=1)
    with pytest.raises(ConnectionDropped):
        send_mail(client, key="run-2:5")
    assert [m["idempotency_key"] for m in sent(client)] == ["run-2:5"]
    assert requests_log(client)[0]["fault"] == "drop_response"
    assert send_mail(client, key="run-2:5").status_code == 200
    assert len(sent(client)) == 2  # a blind retry sends twice


def test_a_dropped_response_breaks_a_real_connection() -> None:
    with BackgroundServer(create_app()) as server, httpx.Client(base_url=server.url) as http:
        http.post(
            "/_sandbox/faults", json={"provider": "mail", "mode": "drop_response", "delay_ms": 1}
        )
        with pytest.raises(httpx.RemoteProtocolError):
            http.post("/mail/send", json=MAIL, headers={"Idempotency-Key": "run-3:2"})
        assert http.get("/mail/sent").json()["messages"][0]["idempotency_key"] == "run-3:2"


def test_faults_can_be_listed_switched_off_and_reset(client: TestClient) -> None:
    arm(client, provider="crm", mode="error")
    arm(client, provider="echo", mode="delay", delay_ms=5)
    assert set(client.get("/_sandbox/faults").json()["faults"]) == {"crm", "echo"}
    arm(client, provider="crm", mode="off")
    assert set(client.get("/_sandbox/faults").json()["faults"]) == {"echo"}
    assert client.delete("/_sandbox/faults").json() == {"faults": {}}


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"provider": "bank", "mode": "error"}, "provider"),
        ({"provider": "mail", "mode": "explode"}, "mode"),
        ({"provider": "mail", "mode": "delay", "delay_ms": -1}, "delay_ms"),
        ({"provider": "mail", "mode": "error", "count": 0}, "count"),
    ],
)
def test_bad_fault_specs_are_400(client: TestClient, spec: dict[str, Any], field: str) -> None:
    response = client.post("/_sandbox/faults", json=spec)
    assert response.status_code == 400 and field in response.json()["error"]


def test_a_new_provider_plugs_in_with_recording_and_faults() -> None:
    class Counter:
        name = "counter"

        def __init__(self) -> None:
            self.value = 0

        def endpoints(self) -> list[Endpoint]:
            return [Endpoint("POST", "/counter/add", self.add)]

        def reset(self) -> None:
            self.value = 0

        async def add(self, request: ProviderRequest) -> Response:
            self.value += 1
            return JSONResponse({"value": self.value, "key": request.idempotency_key})

    client = TestClient(create_app([new() for new in PROVIDERS] + [Counter()]))
    assert client.post("/counter/add", headers={"Idempotency-Key": "k"}).json() == {
        "value": 1,
        "key": "k",
    }
    arm(client, provider="counter", mode="error")
    assert client.post("/counter/add").status_code == 503
    assert [e["provider"] for e in requests_log(client)] == ["counter", "counter"]


def test_healthz(client: TestClient) -> None:
    assert client.get("/healthz").status_code == 200


def test_a_direct_message_a_transfer_and_a_page_fetch_are_effects(client: TestClient) -> None:
    """The endpoints an injected agent is lured to (issue 48): each call is a side effect a
    test can look for, and malformed ones are refused."""
    assert client.post("/chat/dm", json={"user": "@ada", "text": "hi"}).json()["ok"] is True
    assert client.post("/chat/dm", json={"user": "ada", "text": "hi"}).status_code == 404
    transfer = {"iban": "GB33BUKB20201555555555", "amount": 100, "reference": "inv 7"}
    assert client.post("/payments/transfers", json=transfer).json()["status"] == "sent"
    assert client.post("/payments/transfers", json={"iban": "x", "amount": 0}).status_code == 400
    page = client.get("/web/page", params={"url": "https://evil.example/a"}).json()
    assert page["url"] == "https://evil.example/a"
    assert client.get("/web/page", params={"url": "file:///etc/passwd"}).status_code == 400
    effects = {
        (e["provider"], e["effect"]) for e in client.get("/_sandbox/effects").json()["effects"]
    }
    assert {("chat", "dm"), ("payments", "transfer"), ("web", "fetch")} <= effects
    # A DM is not a channel post: the channel's history does not show it.
    assert client.get("/chat/channels/%23sales/messages").json()["messages"] == []
