"""The shop sandbox provider: its reads, and a write deduplicated by Idempotency-Key."""

import warnings

import pytest
from starlette.exceptions import StarletteDeprecationWarning

from sandbox.faults import ConnectionDropped
from sandbox.providers import create_app

with warnings.catch_warnings():
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

ORDER = {"sku": "sku-mug", "quantity": 2}


@pytest.fixture
def client() -> TestClient:
    return TestClient(create_app())


def orders(client: TestClient) -> list[dict]:
    return client.get("/_sandbox/effects", params={"provider": "shop"}).json()["effects"]


def order(client: TestClient, key: str | None, body: dict = ORDER):
    return client.post("/shop/orders", json=body, headers={"Idempotency-Key": key} if key else {})


def test_the_reads_answer() -> None:
    client = TestClient(create_app())
    assert [p["sku"] for p in client.get("/shop/products?q=tea").json()["products"]] == [
        "sku-tea",
        "sku-pot",
    ]
    assert client.get("/shop/products/sku-pot").json()["price_cents"] == 5400
    assert client.get("/shop/products/sku-nope").status_code == 404


def test_a_repeated_key_replays_the_order_instead_of_placing_another(client) -> None:
    first = order(client, "run-1:4")
    again = order(client, "run-1:4")
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json() and again.headers["idempotent-replayed"] == "true"
    assert order(client, "run-1:4", {**ORDER, "quantity": 3}).status_code == 400
    assert [(e["key"], e["total_cents"]) for e in orders(client)] == [("run-1:4", 3600)]
    order(client, None)
    order(client, None)
    assert len(orders(client)) == 3  # without a key every request orders


def test_a_dropped_response_still_places_the_order(client) -> None:
    spec = {
        "provider": "shop",
        "mode": "drop_response",
        "path": "/shop/orders",
        "count": 1,
        "delay_ms": 0,
    }
    assert client.post("/_sandbox/faults", json=spec).status_code == 200
    with pytest.raises(ConnectionDropped):
        order(client, "run-2:4")
    assert [e["key"] for e in orders(client)] == ["run-2:4"]
    assert order(client, "run-2:4").headers["idempotent-replayed"] == "true"  # the resend
    assert len(orders(client)) == 1


def test_bad_orders_are_refused_without_an_effect(client) -> None:
    assert order(client, "k", {"sku": "sku-mug", "quantity": 0}).status_code == 400
    assert order(client, "k2", {"sku": "nope", "quantity": 1}).status_code == 400
    for sku in ({"a": 1}, ["sku-mug"], None, 7):  # a value no product is named by, not a 500
        refused = order(client, None, {"sku": sku, "quantity": 1})
        assert refused.status_code == 400 and "sku" in refused.text, sku
    assert orders(client) == []
