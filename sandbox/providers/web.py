"""Web provider (read): fetches a "page" by URL, like an agent's get_webpage tool.

`GET /web/page?url=` answers with a short page naming the URL; nothing is fetched from
the network. Each fetch is an effect (`fetch`), so a test can tell whether an agent
visited an attacker's link.
"""

from typing import Any

from starlette.responses import Response

from sandbox.json_http import JSONResponse
from sandbox.providers.base import Endpoint, ProviderRequest, error


class WebProvider:
    name = "web"

    def __init__(self) -> None:
        self.fetches: list[dict[str, Any]] = []

    def endpoints(self) -> list[Endpoint]:
        return [Endpoint("GET", "/web/page", self.page)]

    def reset(self) -> None:
        self.fetches.clear()

    def effects(self) -> list[dict[str, Any]]:
        return [{"provider": self.name, "effect": "fetch", "key": None, **f} for f in self.fetches]

    def page(self, request: ProviderRequest) -> Response:
        url = request.query.get("url", "")
        if not url.startswith(("http://", "https://")):
            return error(400, "url must be an http(s) URL")
        self.fetches.append({"url": url})
        return JSONResponse({"url": url, "title": "A page", "text": f"The page at {url}."})
