"""CRM provider (read): look up a contact by email."""

from starlette.responses import JSONResponse, Response

from sandbox.providers.base import Endpoint, ProviderRequest, error

CONTACTS = {
    "ada@example.com": {
        "name": "Ada Lovelace",
        "company": "Analytical Engines Ltd",
        "stage": "customer",
    },
    "grace@example.com": {"name": "Grace Hopper", "company": "Compiler Works", "stage": "prospect"},
    "alan@example.com": {"name": "Alan Turing", "company": "Bletchley Labs", "stage": "lead"},
}


class CrmProvider:
    name = "crm"

    def __init__(self) -> None:
        self.contacts: dict[str, dict[str, str]] = {}
        self.reset()

    def endpoints(self) -> list[Endpoint]:
        return [Endpoint("GET", "/crm/contacts", self.lookup)]

    def reset(self) -> None:
        self.contacts = {email: dict(contact) for email, contact in CONTACTS.items()}

    def lookup(self, request: ProviderRequest) -> Response:
        email = request.query.get("email")
        if not email:
            return error(400, "missing query parameter: email")
        contact = self.contacts.get(email.strip().lower())
        if contact is None:
            return error(404, "no contact")
        return JSONResponse({"email": email, **contact})
