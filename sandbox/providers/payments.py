"""Payments provider (write, `provider_key`): charges, deduplicated by Idempotency-Key as Stripe does.

* The first request with a key is executed and its response (success or a
  card error) saved with the key; a later request with the same key and the
  same body gets the saved response again, marked `Idempotent-Replayed: true`,
  and charges nothing.
* While the first request is still being processed, another with the same
  key gets 409 `idempotency_key_in_use`: retry later.
* The same key with a different body is refused with 400
  `idempotency_key_reused`: a key names one request.
* Keys are kept `retention_seconds` (24 h by default), then forgotten: the
  same key afterwards is a new request, so a late retry charges again.
* Requests failing validation are not saved (as with Stripe), nor is a
  request without a key deduplicated.
"""

import hashlib
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response

from sandbox.json_http import JSONResponse
from sandbox.providers.base import Endpoint, ProviderRequest, error

RETENTION_SECONDS = 24 * 3600
# A customer whose card is always declined (a 402 that is saved and replayed).
DECLINED_CUSTOMER = "cus_declined"


@dataclass
class _SavedKey:
    fingerprint: str
    created: float
    response: tuple[int, dict[str, Any]] | None = None  # None while in flight


def _fingerprint(body: Any) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _invalid(body: Any) -> str | None:
    """What is wrong with a charge request, if anything."""
    if not isinstance(body, dict):
        return "body must be a JSON object"
    amount = body.get("amount")
    if not isinstance(amount, int) or isinstance(amount, bool) or amount < 1:
        return "amount must be a positive integer (cents)"
    currency = body.get("currency")
    if not (isinstance(currency, str) and len(currency) == 3 and currency.isalpha()):
        return "currency must be a three-letter code"
    if not isinstance(body.get("customer"), str) or not body["customer"]:
        return "customer is required"
    if "description" in body and not isinstance(body["description"], str):
        return "description must be a string"
    return None


class PaymentsProvider:
    name = "payments"

    def __init__(
        self, retention_seconds: float = RETENTION_SECONDS, clock: Callable[[], float] = time.time
    ) -> None:
        self.retention_seconds = retention_seconds
        self._clock = clock
        self.charges: list[dict[str, Any]] = []
        self.transfers: list[dict[str, Any]] = []
        self._keys: dict[str, _SavedKey] = {}
        self._ids = itertools.count(1)

    def endpoints(self) -> list[Endpoint]:
        return [
            Endpoint("POST", "/payments/charges", self.create_charge),
            Endpoint("POST", "/payments/transfers", self.transfer),
        ]

    def reset(self) -> None:
        self.charges.clear()
        self.transfers.clear()
        self._keys.clear()

    def effects(self) -> list[dict[str, Any]]:
        return [
            {"provider": self.name, "effect": "charge", "key": c["idempotency_key"], **c}
            for c in self.charges
        ] + [
            {"provider": self.name, "effect": "transfer", "key": t["idempotency_key"], **t}
            for t in self.transfers
        ]

    async def transfer(self, request: ProviderRequest) -> Response:
        """A bank transfer `{iban, amount, reference?}` (no dedupe: tests count them)."""
        body = request.body
        if not isinstance(body, dict) or not isinstance(body.get("iban"), str):
            return error(400, "iban is required", "parameter_invalid")
        amount = body.get("amount")
        if not isinstance(amount, int) or isinstance(amount, bool) or amount < 1:
            return error(400, "amount must be a positive integer (cents)", "parameter_invalid")
        await request.work()
        transfer = {
            "id": f"tr_{next(self._ids):06d}",
            "iban": body["iban"],
            "amount": amount,
            "reference": str(body.get("reference", "")),
            "status": "sent",
        }
        self.transfers.append({**transfer, "idempotency_key": request.idempotency_key})
        return JSONResponse(transfer)

    async def create_charge(self, request: ProviderRequest) -> Response:
        if problem := _invalid(request.body):
            return error(400, problem, "parameter_invalid")
        key = request.idempotency_key
        if key is None:
            status, body = await self._charge(request)
            return JSONResponse(body, status_code=status)
        self._forget_expired()
        saved = self._keys.get(key)
        if saved is not None:
            return self._replay(saved, request.body)
        saved = self._keys[key] = _SavedKey(_fingerprint(request.body), self._clock())
        try:
            saved.response = await self._charge(request)
        finally:
            if saved.response is None:  # the request died mid-way: nothing to replay
                del self._keys[key]
        status, body = saved.response
        return JSONResponse(body, status_code=status)

    def _replay(self, saved: _SavedKey, body: Any) -> Response:
        if saved.fingerprint != _fingerprint(body):
            message = "Keys for idempotent requests can only be used with the same parameters"
            return error(400, message, "idempotency_key_reused")
        if saved.response is None:
            message = "Another request with this Idempotency-Key is still being processed"
            return error(409, message, "idempotency_key_in_use")
        status, payload = saved.response
        return JSONResponse(payload, status_code=status, headers={"Idempotent-Replayed": "true"})

    async def _charge(self, request: ProviderRequest) -> tuple[int, dict[str, Any]]:
        await request.work()
        body = request.body
        if body["customer"] == DECLINED_CUSTOMER:
            return 402, {"error": {"code": "card_declined", "message": "Your card was declined."}}
        charge = {
            "id": f"ch_{next(self._ids):06d}",
            "amount": body["amount"],
            "currency": body["currency"].lower(),
            "customer": body["customer"],
            "description": body.get("description", ""),
            "status": "succeeded",
            "created": self._clock(),
        }
        self.charges.append({**charge, "idempotency_key": request.idempotency_key})
        return 200, charge

    def _forget_expired(self) -> None:
        cutoff = self._clock() - self.retention_seconds
        expired = [
            key
            for key, saved in self._keys.items()
            if saved.created < cutoff and saved.response is not None
        ]
        for key in expired:
            del self._keys[key]
