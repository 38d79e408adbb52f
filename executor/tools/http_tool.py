"""Sends one tool call to its provider over HTTP and classifies what can go wrong."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx

from executor.config import ExecutorConfig
from executor.tools.catalogue import Tool


class ToolSendError(Exception):
    """A tool request that did not produce a usable response."""


class NotSent(ToolSendError):
    """The request never left: nothing can have happened at the provider."""


class MaybeSent(ToolSendError):
    """The request may have reached the provider (timeout or reset after it was written)."""


class ProviderError(ToolSendError):
    """The provider answered with an HTTP error status."""

    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        """429 and 5xx may succeed later; other 4xx will not."""
        return self.status == 429 or self.status >= 500


# Errors raised before any byte of the request was written.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


class HttpToolClient:
    """One shared httpx client for every provider in the catalogue."""

    def __init__(
        self, config: ExecutorConfig, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self._config = config
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(config.tool_timeout_seconds),
            # Drop idle connections before common servers do (uvicorn: 5 s), so a
            # write is rarely sent on a socket the server is closing: that would
            # turn into a needless unknown outcome.
            limits=httpx.Limits(keepalive_expiry=2.0),
            transport=transport,
            follow_redirects=False,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def send(self, tool: Tool, arguments: Mapping[str, Any], idempotency_key: str) -> Any:
        """Send the call; return the provider's JSON (or text) or raise a ToolSendError."""
        url = self._config.provider_url(tool.provider) + (tool.path or "")
        method = tool.method or "POST"
        headers = {"Idempotency-Key": idempotency_key, "Accept": "application/json"}
        if method == "GET":
            request = self._http.build_request(
                method, url, params=_query(arguments), headers=headers
            )
        else:
            request = self._http.build_request(method, url, json=dict(arguments), headers=headers)
        try:
            response = await self._http.send(request)
        except _NOT_SENT as exc:
            raise NotSent(f"could not connect to {tool.provider}: {type(exc).__name__}") from exc
        except httpx.TransportError as exc:
            # Timeouts and resets after the request was (partly) written: the
            # provider may have acted on it.
            raise MaybeSent(f"no response from {tool.provider}: {type(exc).__name__}") from exc
        return _parse(response)


def _query(arguments: Mapping[str, Any]) -> dict[str, str]:
    return {
        key: value if isinstance(value, str) else json.dumps(value)
        for key, value in arguments.items()
        if value is not None
    }


def _parse(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        raise ProviderError(response.status_code, _error_message(response), _retry_after(response))
    if not response.content:
        return None
    try:
        return response.json()
    except ValueError:
        return response.text


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or response.reason_phrase
    if isinstance(body, dict):
        error = body.get("error") or body.get("message") or body.get("detail")
        if isinstance(error, dict):
            error = error.get("message") or json.dumps(error)
        if error:
            return str(error)[:500]
    return json.dumps(body)[:500]


def _retry_after(response: httpx.Response) -> float | None:
    raw = response.headers.get("retry-after")
    try:
        return max(0.0, float(raw)) if raw else None
    except ValueError:
        return None
