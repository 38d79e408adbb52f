"""Shop provider: a small API that describes itself in OpenAPI 3, for the OpenAPI import.

`GET /shop/openapi.json` serves the document (its server URL is the address
the request came to), with three operations:

* `listProducts` — `GET /shop/products?q=` (read);
* `getProduct` — `GET /shop/products/{sku}` (read);
* `createOrder` — `POST /shop/orders` (write), documenting an `Idempotency-Key`
  header, which it honours as payments does: the first request with a key is
  executed and its answer kept; the same key and body again gets that answer
  (`Idempotent-Replayed: true`) and orders nothing; the same key while the
  first is in flight gets 409, with another body 400. Without a key every
  request orders.

Every order placed is an effect (`GET /_sandbox/effects?provider=shop`) with
the key of the request that placed it, so duplicates can be counted; the
app's faults apply as to every provider (a `drop_response` places the order,
then breaks the connection).
"""

import hashlib
import itertools
import json
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response

from sandbox.json_http import JSONResponse
from sandbox.providers.base import Endpoint, ProviderRequest, error

PRODUCTS = {
    "sku-tea": {"sku": "sku-tea", "name": "Green tea, 100 g", "price_cents": 650, "stock": 40},
    "sku-mug": {"sku": "sku-mug", "name": "Stoneware mug", "price_cents": 1800, "stock": 12},
    "sku-pot": {"sku": "sku-pot", "name": "Cast-iron teapot", "price_cents": 5400, "stock": 3},
}


def openapi_document(server_url: str) -> dict[str, Any]:
    """The shop's OpenAPI 3.0 document, served from `server_url`."""
    sku = {"name": "sku", "in": "path", "required": True, "schema": {"type": "string"}}
    return {
        "openapi": "3.0.3",
        "info": {"title": "Sandbox shop", "version": "1.0.0"},
        "servers": [{"url": server_url}],
        "paths": {
            "/products": {
                "get": {
                    "operationId": "listProducts",
                    "summary": "List the products whose name contains a word.",
                    "parameters": [{"name": "q", "in": "query", "schema": {"type": "string"}}],
                    "responses": _ok("#/components/schemas/ProductList"),
                }
            },
            "/products/{sku}": {
                "get": {
                    "operationId": "getProduct",
                    "summary": "Get one product by its SKU.",
                    "parameters": [sku],
                    "responses": _ok("#/components/schemas/Product"),
                }
            },
            "/orders": {
                "post": {
                    "operationId": "createOrder",
                    "summary": "Order a quantity of one product.",
                    "description": "Send an Idempotency-Key: a retry under it orders once.",
                    "parameters": [
                        {"name": "Idempotency-Key", "in": "header", "schema": {"type": "string"}}
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/OrderRequest"}
                            }
                        },
                    },
                    "responses": _ok("#/components/schemas/Order"),
                }
            },
        },
        "components": {"schemas": _SCHEMAS},
    }


def _ok(ref: str) -> dict[str, Any]:
    content = {"application/json": {"schema": {"$ref": ref}}}
    return {"200": {"description": "OK", "content": content}}


_SCHEMAS: dict[str, Any] = {
    "Product": {
        "type": "object",
        "properties": {
            "sku": {"type": "string"},
            "name": {"type": "string"},
            "price_cents": {"type": "integer"},
            "stock": {"type": "integer"},
        },
    },
    "ProductList": {
        "type": "object",
        "properties": {
            "products": {"type": "array", "items": {"$ref": "#/components/schemas/Product"}}
        },
    },
    "OrderRequest": {
        "type": "object",
        "required": ["sku", "quantity"],
        "properties": {
            "id": {"type": "string", "readOnly": True},
            "sku": {"type": "string", "description": "The product to order."},
            "quantity": {"type": "integer", "minimum": 1},
            "note": {"type": "string", "nullable": True},
        },
    },
    "Order": {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "sku": {"type": "string"},
            "quantity": {"type": "integer"},
            "total_cents": {"type": "integer"},
        },
    },
}


@dataclass
class _Kept:
    fingerprint: str
    response: tuple[int, dict[str, Any]] | None = None  # None while in flight


class ShopProvider:
    name = "shop"

    def __init__(self) -> None:
        self.orders: list[dict[str, Any]] = []
        self._keys: dict[str, _Kept] = {}
        self._ids = itertools.count(1)

    def endpoints(self) -> list[Endpoint]:
        return [
            Endpoint("GET", "/shop/openapi.json", self.document, recorded=False),
            Endpoint("GET", "/shop/products", self.list_products),
            Endpoint("GET", "/shop/products/{sku}", self.get_product),
            Endpoint("POST", "/shop/orders", self.create_order),
        ]

    def reset(self) -> None:
        self.orders.clear()
        self._keys.clear()

    def effects(self) -> list[dict[str, Any]]:
        return [{"provider": self.name, "effect": "order", **order} for order in self.orders]

    def document(self, request: ProviderRequest) -> Response:
        host = request.headers.get("host", "127.0.0.1")
        return JSONResponse(openapi_document(f"http://{host}/shop"))

    def list_products(self, request: ProviderRequest) -> Response:
        word = (request.query.get("q") or "").lower()
        found = [p for p in PRODUCTS.values() if word in str(p["name"]).lower()]
        return JSONResponse({"products": found})

    def get_product(self, request: ProviderRequest) -> Response:
        product = PRODUCTS.get(request.path.rsplit("/", 1)[-1])
        return JSONResponse(product) if product else error(404, "no such product")

    async def create_order(self, request: ProviderRequest) -> Response:
        if problem := _invalid(request.body):
            return error(400, problem)
        key = request.idempotency_key
        if key is None:
            return JSONResponse(await self._order(request))
        fingerprint = hashlib.sha256(json.dumps(request.body, sort_keys=True).encode()).hexdigest()
        kept = self._keys.get(key)
        if kept is not None:
            return _replay(kept, fingerprint)
        kept = self._keys[key] = _Kept(fingerprint)
        try:
            kept.response = (200, await self._order(request))
        finally:
            if kept.response is None:  # died mid-way: nothing to replay
                del self._keys[key]
        return JSONResponse(kept.response[1], status_code=kept.response[0])

    async def _order(self, request: ProviderRequest) -> dict[str, Any]:
        await request.work()
        body = request.body
        product = PRODUCTS[body["sku"]]
        order = {
            "id": f"ord_{next(self._ids):06d}",
            "sku": body["sku"],
            "quantity": body["quantity"],
            "total_cents": product["price_cents"] * body["quantity"],
        }
        self.orders.append({**order, "note": body.get("note"), "key": request.idempotency_key})
        return order


def _replay(kept: _Kept, fingerprint: str) -> Response:
    if kept.fingerprint != fingerprint:
        return error(400, "this Idempotency-Key was used with another request")
    if kept.response is None:
        return error(409, "a request with this Idempotency-Key is still being processed")
    status, body = kept.response
    return JSONResponse(body, status_code=status, headers={"Idempotent-Replayed": "true"})


def _invalid(body: Any) -> str | None:
    if not isinstance(body, dict):
        return "body must be a JSON object"
    if not isinstance(body.get("sku"), str) or body["sku"] not in PRODUCTS:
        return f"sku must be one of {', '.join(PRODUCTS)}"
    quantity = body.get("quantity")
    if not isinstance(quantity, int) or isinstance(quantity, bool) or quantity < 1:
        return "quantity must be a positive integer"
    if body.get("note") is not None and not isinstance(body["note"], str):
        return "note must be a string"
    return None
