"""CRM provider: look up a contact by email (read) and upsert one (write, idempotent).

An upsert is keyed by the contact's email, its identity: applying the same
upsert twice leaves the same contact, and the second one changes nothing
(`"changed": false`). Only upserts that changed something are side effects.
"""

from typing import Any

from starlette.responses import Response

from sandbox.json_http import JSONResponse
from sandbox.providers.base import Endpoint, ProviderRequest, error, wrong_optional_strings

CONTACTS = {
    "ada@example.com": {
        "name": "Ada Lovelace",
        "company": "Analytical Engines Ltd",
        "stage": "customer",
    },
    "grace@example.com": {"name": "Grace Hopper", "company": "Compiler Works", "stage": "prospect"},
    "alan@example.com": {"name": "Alan Turing", "company": "Bletchley Labs", "stage": "lead"},
}
FIELDS = ("name", "company", "stage")
STAGES = ("lead", "prospect", "customer", "churned")


class CrmProvider:
    name = "crm"

    def __init__(self) -> None:
        self.contacts: dict[str, dict[str, str]] = {}
        self.changes: list[dict[str, Any]] = []
        self.reset()

    def endpoints(self) -> list[Endpoint]:
        return [
            Endpoint("GET", "/crm/contacts", self.lookup),
            Endpoint("POST", "/crm/contacts/upsert", self.upsert),
        ]

    def reset(self) -> None:
        self.contacts = {email: dict(contact) for email, contact in CONTACTS.items()}
        self.changes = []

    def effects(self) -> list[dict[str, Any]]:
        return [{"provider": self.name, "effect": "upsert", **change} for change in self.changes]

    def lookup(self, request: ProviderRequest) -> Response:
        email = request.query.get("email")
        if not email:
            return error(400, "missing query parameter: email")
        contact = self.contacts.get(email.strip().lower())
        if contact is None:
            return error(404, "no contact")
        return JSONResponse({"email": email, **contact})

    async def upsert(self, request: ProviderRequest) -> Response:
        body = request.body
        if not isinstance(body, dict) or not isinstance(body.get("email"), str):
            return error(400, "missing field: email")
        if problem := wrong_optional_strings(body, FIELDS):
            return error(400, problem)
        if body.get("stage", "lead") not in STAGES:
            return error(400, f"stage must be one of {', '.join(STAGES)}")
        await request.work()
        email = body["email"].strip().lower()
        before = self.contacts.get(email)
        after = {**(before or {}), **{f: body[f] for f in FIELDS if f in body}}
        changed = after != before
        if changed:
            self.contacts[email] = after
            change = {"key": request.idempotency_key, "email": email, "created": before is None}
            self.changes.append(change)
        return JSONResponse(
            {"contact": {"email": email, **after}, "created": before is None, "changed": changed}
        )
