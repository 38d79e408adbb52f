"""Mailbox provider (inbound): messages arrive in mailboxes with a Gmail-like history.

Each arriving message appends a history record with the next history id (one
counter per provider, as Gmail's is per account). A reader lists the changes
after an id, the way `users.history.list` does:

    GET /mailbox/<address>/history?startHistoryId=N[&pageToken=T][&maxResults=M]
    -> {"history": [{"id": "7", "messagesAdded": [{"message": {...}}]}, ...],
        "historyId": "9", "nextPageToken": "..."}

Messages are delivered by tests (the "mail network"):
`POST /mailbox/<address>/messages` with a message `{"message_id", "from", "to",
"subject", "text", "headers"}`, answered with the new history id. Listing
calls are recorded (tests count fetches); deliveries are not.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from sandbox.json_http import JSONResponse
from sandbox.providers.base import Endpoint, ProviderRequest, error

DEFAULT_PAGE = 100


def _address(path: str) -> str:
    # /mailbox/<address>/...
    return path.split("/")[2].lower()


class MailboxProvider:
    name = "mailbox"

    def __init__(self) -> None:
        self.history: dict[str, list[dict[str, Any]]] = {}
        self.last_id = 0

    def endpoints(self) -> list[Endpoint]:
        return [
            Endpoint("GET", "/mailbox/{address}/history", self.list_history),
            Endpoint("POST", "/mailbox/{address}/messages", self.deliver, recorded=False),
        ]

    def reset(self) -> None:
        self.history.clear()
        self.last_id = 0

    def deliver(self, request: ProviderRequest) -> Response:
        message = request.body
        if not isinstance(message, dict) or not isinstance(message.get("message_id"), str):
            return error(400, "body must be a message with a message_id")
        self.last_id += 1
        record = {"id": str(self.last_id), "messagesAdded": [{"message": message}]}
        self.history.setdefault(_address(request.path), []).append(record)
        return JSONResponse({"historyId": str(self.last_id)})

    def list_history(self, request: ProviderRequest) -> Response:
        try:
            start = int(request.query.get("startHistoryId", ""))
            after = int(request.query.get("pageToken") or start)
            size = int(request.query.get("maxResults") or DEFAULT_PAGE)
        except ValueError:
            return error(400, "startHistoryId, pageToken and maxResults are integers")
        records = [r for r in self.history.get(_address(request.path), []) if int(r["id"]) > after]
        page = records[:size]
        body: dict[str, Any] = {"history": page, "historyId": str(self.last_id)}
        if len(records) > size:
            body["nextPageToken"] = page[-1]["id"]
        return JSONResponse(body)
