"""Connecting an account the way a browser does: the start link, the sandbox provider's
consent, then the control plane's callback."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import httpx

from tests.harness.auth import bearer


async def follow_start_link(
    http_url: str, workspace: str, key: str, account: str, provider: str = "chat", **query: str
) -> dict[str, Any]:
    """The callback's answer (it names the new connection) after following every redirect."""
    async with httpx.AsyncClient(base_url=http_url) as client:
        start = await client.get(
            f"/connections/{workspace}/{provider}/start",
            params={"login_hint": account, **query},
            headers=bearer(key),
        )
        assert start.status_code == 302, start.text
        consent = await client.get(start.headers["location"])
        assert consent.status_code == 302, consent.text
        back = urlsplit(consent.headers["location"])
        done = await client.get(f"{back.path}?{back.query}")
        assert done.status_code == 200, done.text
        answer: dict[str, Any] = done.json()
        return answer
