"""Mail provider (write): sends (records) a message; the Idempotency-Key is kept, not honoured.

Not deduplicating is the point: a test counts how many sends each key produced,
so a retried write without a provider that dedupes shows up as a double send.
"""

import time
import uuid
from typing import Any

from starlette.responses import JSONResponse, Response

from sandbox.providers.base import Endpoint, ProviderRequest, error, missing_string_field

FIELDS = ("to", "subject", "body")


class MailProvider:
    name = "mail"

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def endpoints(self) -> list[Endpoint]:
        return [
            Endpoint("POST", "/mail/send", self.send),
            Endpoint("GET", "/mail/sent", self.list_sent, recorded=False),
        ]

    def reset(self) -> None:
        self.sent.clear()

    def send(self, request: ProviderRequest) -> Response:
        if problem := missing_string_field(request.body, FIELDS):
            return error(400, problem)
        message_id = f"{uuid.uuid4()}@sandbox"
        message = {field: request.body[field] for field in FIELDS}
        self.sent.append(
            {
                "message_id": message_id,
                **message,
                "idempotency_key": request.idempotency_key,
                "time": time.time(),
            }
        )
        return JSONResponse({"message_id": message_id, "status": "sent"})

    def list_sent(self, request: ProviderRequest) -> Response:
        return JSONResponse({"messages": list(self.sent)})
