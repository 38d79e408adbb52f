"""Slack's Web API, as far as notifications use it: chat.postMessage and chat.update.

The wire format is Slack's (and the slack-sdk's): a JSON body, the bot token in
`Authorization: Bearer xoxb-…`, HTTP 200 with `{"ok": true, "channel", "ts"}` or
`{"ok": false, "error": "invalid_auth" | "channel_not_found" | "message_not_found"}`.
The bot token it accepts is BOT_TOKEN. Posts and updates are listed as effects, and
every call is in the request log (body included) like any provider's.
"""

from __future__ import annotations

import re
import time
from typing import Any

from starlette.responses import Response

from sandbox.json_http import JSONResponse
from sandbox.providers.base import Endpoint, ProviderRequest

BOT_TOKEN = "xoxb-sandbox-bot-token"
CHANNEL = re.compile(r"^(#[a-z0-9_-]{1,80}|[CGDU][A-Z0-9]{2,20})$")


class SlackApiProvider:
    name = "slack"
    # Slack checks its own bot tokens (not the sandbox's OAuth grants).
    own_auth = True

    def __init__(self) -> None:
        self.messages: dict[tuple[str, str], dict[str, Any]] = {}
        self.updates: list[dict[str, Any]] = []

    def endpoints(self) -> list[Endpoint]:
        return [
            Endpoint("POST", "/slack/api/chat.postMessage", self.post_message),
            Endpoint("POST", "/slack/api/chat.update", self.update),
        ]

    def reset(self) -> None:
        self.messages.clear()
        self.updates.clear()

    def effects(self) -> list[dict[str, Any]]:
        posts = [
            {"provider": self.name, "effect": "post", "key": None, **m}
            for m in self.messages.values()
        ]
        edits = [
            {"provider": self.name, "effect": "update", "key": None, **u} for u in self.updates
        ]
        return posts + edits

    @staticmethod
    def _refused(request: ProviderRequest) -> Response | None:
        if request.headers.get("authorization") != f"Bearer {BOT_TOKEN}":
            return JSONResponse({"ok": False, "error": "invalid_auth"})
        if not isinstance(request.body, dict) or not isinstance(request.body.get("channel"), str):
            return JSONResponse({"ok": False, "error": "channel_not_found"})
        if not CHANNEL.match(request.body["channel"]):
            return JSONResponse({"ok": False, "error": "channel_not_found"})
        return None

    async def post_message(self, request: ProviderRequest) -> Response:
        if refused := self._refused(request):
            return refused
        body = request.body
        if not body.get("text") and not body.get("blocks"):
            return JSONResponse({"ok": False, "error": "no_text"})
        await request.work()
        channel, ts = body["channel"], f"{time.time():.6f}"
        self.messages[(channel, ts)] = {
            "channel": channel,
            "ts": ts,
            "text": body.get("text", ""),
            "blocks": body.get("blocks", []),
        }
        return JSONResponse({"ok": True, "channel": channel, "ts": ts})

    async def update(self, request: ProviderRequest) -> Response:
        if refused := self._refused(request):
            return refused
        body = request.body
        found = self.messages.get((body["channel"], str(body.get("ts"))))
        if found is None:
            return JSONResponse({"ok": False, "error": "message_not_found"})
        await request.work()
        found.update(text=body.get("text", ""), blocks=body.get("blocks", []))
        self.updates.append({"channel": body["channel"], "ts": body["ts"], "text": found["text"]})
        return JSONResponse({"ok": True, "channel": body["channel"], "ts": body["ts"]})
