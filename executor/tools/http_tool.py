"""Sends one tool call to its provider over HTTP and classifies what can go wrong."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import httpcore
import httpx

from executor import horizon
from executor.config import ExecutorConfig
from executor.retry_after import retry_after
from executor.tools import netguard, template
from executor.tools.catalogue import Lookup, Tool, ToolCallRejected

if TYPE_CHECKING:
    from executor.tools.credentials import Credential


class ToolSendError(Exception):
    """A tool request that did not produce a usable response."""


class NotSent(ToolSendError):
    """The request never left: nothing can have happened at the provider."""


class Blocked(NotSent):
    """The tool's host is one tools may not reach (executor/tools/netguard.py): refused
    before anything left, and sending again would be refused again."""


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


# The most of a registry HTTP tool's answer read when its template sets no limit.
DEFAULT_MAX_RESPONSE_BYTES = 8 * 1024 * 1024

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
        # Registry tools' URLs are a workspace's data: their connections are guarded
        # (netguard.py). The catalogue's providers are the operator's and are not.
        guarded = transport or netguard.guard(
            httpx.AsyncHTTPTransport(limits=httpx.Limits(keepalive_expiry=2.0)),
            httpcore.ConnectError,
        )
        self._guarded = httpx.AsyncClient(
            timeout=httpx.Timeout(config.tool_timeout_seconds), transport=guarded,
            follow_redirects=False,
        )  # fmt: skip

    async def aclose(self) -> None:
        await self._http.aclose()
        await self._guarded.aclose()

    async def send(
        self, tool: Tool, arguments: Mapping[str, Any], idempotency_key: str,
        credential: Credential | None = None,
    ) -> Any:  # fmt: skip
        """Send the call; return the provider's JSON (or text) or raise a ToolSendError.

        Every request carries `Idempotency-Key`; a `lookup`-class tool also gets
        the key stamped into its body, where the provider keeps it searchable. With
        a `credential`, its token goes on the request's Authorization header.
        """
        if tool.mcp is not None:
            from executor.tools.transport import call_mcp

            timeout = tool.mcp.timeout_seconds or self._config.tool_timeout_seconds
            return await call_mcp(tool, arguments, idempotency_key, credential, timeout)
        if tool.http is not None:
            return await self._send_template(tool, arguments, idempotency_key, credential)
        method = tool.method or "POST"
        body = dict(arguments)
        if tool.lookup is not None:
            body = stamp(body, tool.lookup, idempotency_key)
        return await self._request(
            tool.provider, method, tool.path or "", body, idempotency_key, credential
        )

    async def look_up(
        self, tool: Tool, idempotency_key: str, credential: Credential | None = None
    ) -> Any | None:
        """Ask a `lookup`-class provider for the action stamped with this key.

        Returns the provider's record of it, or None when it has none (the
        action did not happen). Failures raise like `send` (a lookup is a read).
        """
        if tool.lookup is None:
            raise ValueError(f"tool {tool.name!r} has no lookup")
        spec = tool.lookup
        query = spec.query_for(idempotency_key)
        if tool.http is not None:  # a registry tool: the lookup URL is absolute
            asked = template.Rendered("GET", spec.path, {}, query, None)
            body = await self._templated(tool, asked, idempotency_key, credential)
        else:
            body = await self._request(
                tool.provider, "GET", spec.path, query, idempotency_key, credential
            )
        found = body.get(spec.matches) if isinstance(body, dict) else None
        if not isinstance(found, list):
            raise ProviderError(502, f"lookup answer has no list {spec.matches!r}")
        return found[0] if found else None

    async def _request(
        self, provider: str, method: str, path: str, arguments: Mapping[str, Any], key: str,
        credential: Credential | None = None,
    ) -> Any:  # fmt: skip
        url = self._config.provider_url(provider) + path
        headers = {"Idempotency-Key": key, "Accept": "application/json"}
        if credential is not None:  # fetched now: the freshest token, on this request only
            headers["Authorization"] = await credential.header()
        if method == "GET":
            request = self._http.build_request(
                method, url, params=_query(arguments), headers=headers
            )
        else:
            request = self._http.build_request(method, url, json=dict(arguments), headers=headers)
        if (refusal := horizon.blocked_now()) is not None:  # the run's last-moment check
            raise NotSent(f"not sent: {refusal}")
        try:
            response = await self._http.send(request)
        except _NOT_SENT as exc:
            raise NotSent(f"could not connect to {provider}: {type(exc).__name__}") from exc
        except httpx.TransportError as exc:
            # Timeouts and resets after the request was (partly) written: the
            # provider may have acted on it.
            raise MaybeSent(f"no response from {provider}: {type(exc).__name__}") from exc
        if credential is not None and response.status_code in (401, 403):
            raise _refused(credential, response)
        return _parse(response)

    async def _send_template(
        self, tool: Tool, arguments: Mapping[str, Any], key: str, credential: Credential | None
    ) -> Any:
        """A registry HTTP tool's request, from its template (executor/tools/template.py)."""
        assert tool.http is not None
        try:  # checked before the call was started (Catalogue.check_call): never expected
            rendered = template.render(tool.http, arguments)
        except ToolCallRejected as exc:
            raise NotSent(f"{tool.name}: {exc}") from None
        if tool.lookup is not None:
            rendered = dataclasses.replace(
                rendered, body=stamp(rendered.body or {}, tool.lookup, key)
            )
        return await self._templated(tool, rendered, key, credential)

    async def _templated(
        self, tool: Tool, rendered: template.Rendered, key: str, credential: Credential | None
    ) -> Any:
        """Send a rendered request with the key and, fetched now, the connection's token in
        the header `auth` names; the answer cut to the pointer, at most the size cap."""
        assert tool.http is not None
        spec = tool.http
        headers = {"Accept": "application/json", **rendered.headers, tool.idempotency_header: key}
        token = await self._token(tool, credential)
        if token is not None:
            name = "Authorization" if spec.auth == "bearer" else spec.auth.partition(":")[2]
            headers[name] = f"Bearer {token}" if spec.auth == "bearer" else token
        timeout = httpx.Timeout(spec.timeout_seconds or self._config.tool_timeout_seconds)
        try:
            request = self._guarded.build_request(
                rendered.method, rendered.url, params=rendered.params or None, headers=headers,
                json=rendered.body, timeout=timeout,
            )  # fmt: skip
        except (httpx.InvalidURL, ValueError, UnicodeError) as exc:
            why = f"{tool.name}: the request could not be built ({type(exc).__name__})"
            raise NotSent(why) from None
        limit = spec.max_response_bytes or DEFAULT_MAX_RESPONSE_BYTES
        response, too_large = await self._exchange(tool.name, request, limit)
        if credential is not None and response.status_code in (401, 403):
            raise _refused(credential, response)
        if too_large:
            return {"error": f"the response was over the tool's {limit}-byte limit: not kept",
                    "status": response.status_code}  # fmt: skip
        answer = _parse(_redacted(response, token))
        return template.pointed(answer, spec.response_pointer)

    async def _token(self, tool: Tool, credential: Credential | None) -> str | None:
        assert tool.http is not None
        if not tool.http.auth:
            return None
        if credential is None:
            raise NotSent(f"{tool.name} needs its connection's token and has none")
        return await credential.token()

    async def _exchange(
        self, name: str, request: httpx.Request, limit: int
    ) -> tuple[httpx.Response, bool]:
        """The response (its body read up to `limit` bytes) and whether it was over."""
        if (refusal := horizon.blocked_now()) is not None:  # the run's last-moment check
            raise NotSent(f"not sent: {refusal}")
        try:
            response = await self._guarded.send(request, stream=True)
        except netguard.DestinationRefused as exc:
            raise Blocked(f"{name}: {exc}") from None
        except _NOT_SENT as exc:
            raise NotSent(f"could not connect for {name}: {type(exc).__name__}") from exc
        except httpx.TransportError as exc:
            raise MaybeSent(f"no response for {name}: {type(exc).__name__}") from exc
        try:
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body.extend(chunk)
                if len(body) > limit:
                    return response, True
            return _answered(response, bytes(body)), False
        except httpx.TransportError as exc:
            raise MaybeSent(f"response cut off for {name}: {type(exc).__name__}") from exc
        finally:
            await response.aclose()


def _answered(response: httpx.Response, content: bytes) -> httpx.Response:
    """A response holding `content` (already decoded: no content-encoding left to undo)."""
    headers = [
        (k, v) for k, v in response.headers.multi_items()
        if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")
    ]  # fmt: skip
    return httpx.Response(response.status_code, headers=headers, content=content)


def _redacted(response: httpx.Response, token: str | None) -> httpx.Response:
    """The response, with the token blanked should the provider echo it back."""
    if token and token.encode() in response.content:
        return _answered(response, response.content.replace(token.encode(), b"[redacted]"))
    return response


def _refused(credential: Credential, response: httpx.Response) -> Exception:
    """The provider refused the token before acting (RFC 6750): revoked, expired or short
    of scope. The run waits for its connection; the header is never quoted."""
    from executor.tools.credentials import ConnectionUnusable

    challenge = response.headers.get("www-authenticate", "")
    why = (
        "lacks the scope this tool needs"
        if "insufficient_scope" in challenge
        else ("was refused by the provider")
    )
    return ConnectionUnusable(credential.connection_id, why)


def stamp(body: Mapping[str, Any], lookup: Lookup, key: str) -> dict[str, Any]:
    """The body with the key written where the provider keeps it (`body_field[name]`)."""
    field = body.get(lookup.body_field)
    stamped = dict(field) if isinstance(field, Mapping) else {}
    stamped[lookup.header_name] = key
    return {**body, lookup.body_field: stamped}


def _query(arguments: Mapping[str, Any]) -> dict[str, str]:
    return {
        key: value if isinstance(value, str) else json.dumps(value)
        for key, value in arguments.items()
        if value is not None
    }


def _parse(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        raise ProviderError(response.status_code, _error_message(response), retry_after(response))
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
