"""Chat provider (write, class `none`): posts messages, like Slack's chat.postMessage.

It has neither an idempotency key nor a way to ask whether a post was made:
the same request sent twice posts twice. The request's Idempotency-Key is
kept with each post only so tests can count duplicates; the API ignores it.
"""

import re
import time
from typing import Any
from urllib.parse import unquote

from starlette.responses import Response

from sandbox.json_http import JSONResponse
from sandbox.providers.base import Endpoint, ProviderRequest, error, missing_string_field

CHANNEL = re.compile(r"^#[a-z0-9_-]{1,80}$")
USER = re.compile(r"^@[a-z0-9._-]{1,80}$")


class ChatProvider:
    name = "chat"

    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []

    def endpoints(self) -> list[Endpoint]:
        return [
            Endpoint("POST", "/chat/messages", self.post),
            Endpoint("POST", "/chat/dm", self.direct),
            # A read with the channel in its path (a registry tool's templated path).
            Endpoint("GET", "/chat/channels/{channel}/messages", self.history),
        ]

    def reset(self) -> None:
        self.posts.clear()

    def effects(self) -> list[dict[str, Any]]:
        return [
            {
                "provider": self.name,
                "effect": "dm" if "user" in p else "post",
                "key": p["idempotency_key"],
                **p,
            }
            for p in self.posts
        ]

    async def direct(self, request: ProviderRequest) -> Response:
        """A direct message to a user (`{user: "@name", text}`), like Slack's DM."""
        if problem := missing_string_field(request.body, ("user", "text")):
            return error(400, problem)
        user, text = request.body["user"], request.body["text"]
        if not USER.match(user):
            return error(404, "user_not_found")
        await request.work()
        ts = f"{time.time():.6f}"
        self.posts.append(
            {"ts": ts, "user": user, "text": text, "idempotency_key": request.idempotency_key}
        )
        return JSONResponse({"ok": True, "user": user, "ts": ts})

    def history(self, request: ProviderRequest) -> Response:
        """The channel's latest posts (`?limit=`, default 10), newest last."""
        channel = unquote(request.path.removeprefix("/chat/channels/").removesuffix("/messages"))
        if not CHANNEL.match(channel):
            return error(404, "channel_not_found")
        limit = request.query.get("limit", "10")
        if not limit.isdigit():
            return error(400, "limit must be a number")
        posts = [p for p in self.posts if p.get("channel") == channel][-int(limit) :]
        return JSONResponse({"ok": True, "channel": channel, "messages": posts})

    async def post(self, request: ProviderRequest) -> Response:
        if problem := missing_string_field(request.body, ("channel", "text")):
            return error(400, problem)
        channel, text = request.body["channel"], request.body["text"]
        if not CHANNEL.match(channel):
            return error(404, "channel_not_found")
        if not text:
            return error(400, "no_text")
        await request.work()
        ts = f"{time.time():.6f}"
        self.posts.append(
            {"ts": ts, "channel": channel, "text": text, "idempotency_key": request.idempotency_key}
        )
        return JSONResponse({"ok": True, "channel": channel, "ts": ts})
