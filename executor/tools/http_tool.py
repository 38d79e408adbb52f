"""Sends one tool call to its provider over HTTP and classifies what can go wrong."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import aiohttp
import yarl

from executor import http_session
from executor.config import ExecutorConfig
from executor.http_session import FAILED, JSON_TYPE, Answer, encoded, read
from executor.retry_after import retry_after
from executor.tools import template
from executor.tools.catalogue import Lookup, Tool
from executor.tools.rejection import ToolCallRejected
from executor.tools.send_errors import (
    Blocked,
    MaybeSent,
    NotSent,
    ProviderError,
    UnusableAnswer,
)
from executor.tools.transport import call_mcp
from ground import netguard

if TYPE_CHECKING:
    from executor.tools.credentials import Credential


# The most of a registry HTTP tool's answer read when its template sets no limit.
DEFAULT_MAX_RESPONSE_BYTES = 8 * 1024 * 1024

# Errors raised before any byte of the request was written: no connection (DNS, refused,
# TLS handshake, connect timeout or no free pooled connection in time) or no valid URL.
# Everything else (a reset, a timeout or a close after the request was written, a
# keep-alive connection the server closed under the write) may have reached the provider.
_NOT_SENT = (
    aiohttp.ClientConnectorError,
    aiohttp.ConnectionTimeoutError,
    aiohttp.InvalidURL,
    aiohttp.NonHttpUrlClientError,
)


class HttpToolClient:
    """The HTTP client of every tool (executor/http_session.py: aiohttp, keep-alive pools
    made in the running loop): the catalogue's providers on one pool, workspaces' registry
    tools on a guarded one (netguard.py). Neither resends anything on its own."""

    def __init__(self, config: ExecutorConfig) -> None:
        self._config = config
        self._http = http_session.LazySession(
            config.tool_timeout_seconds, request_class=http_session.LastMoment, retry_writes=False
        )
        # Registry tools' URLs are a workspace's data: their connections are guarded
        # (netguard.py) and go direct, never through a proxy that would resolve the name
        # past the check. The catalogue's providers are the operator's and are not.
        self._guarded = http_session.LazySession(
            config.tool_timeout_seconds,
            request_class=http_session.LastMoment,
            retry_writes=False,
            resolver=netguard.GuardedResolver,
            use_env_proxy=False,
        )

    async def aclose(self) -> None:
        await self._http.aclose()
        await self._guarded.aclose()

    async def send(
        self,
        tool: Tool,
        arguments: Mapping[str, Any],
        idempotency_key: str,
        credential: Credential | None = None,
    ) -> Any:
        """Send the call; return the provider's JSON (or text) or raise a ToolSendError.

        Every request carries `Idempotency-Key`; a `lookup`-class tool also gets
        the key stamped into its body, where the provider keeps it searchable. With
        a `credential`, its token goes on the request's Authorization header.
        """
        if tool.mcp is not None:
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
        self,
        provider: str,
        method: str,
        path: str,
        arguments: Mapping[str, Any],
        key: str,
        credential: Credential | None = None,
    ) -> Any:
        url = self._config.provider_url(provider) + path
        headers = {"Idempotency-Key": key, "Accept": "application/json"}
        if credential is not None:  # fetched now: the freshest token, on this request only
            headers["Authorization"] = await credential.header()
        if method == "GET":
            sent: dict[str, Any] = {"params": _query(arguments)}
        else:
            sent = {"data": encoded(dict(arguments))}
            headers.update(JSON_TYPE)
        try:
            async with self._http.get().request(
                method, url, headers=headers, allow_redirects=False, **sent
            ) as answered:
                response = await read(answered)
        except _NOT_SENT as exc:
            raise NotSent(f"could not connect to {provider}: {type(exc).__name__}") from exc
        except FAILED as exc:
            # Timeouts and resets after the request was (partly) written: the
            # provider may have acted on it.
            raise MaybeSent(f"no response from {provider}: {type(exc).__name__}") from exc
        if credential is not None and response.status in (401, 403):
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
        request = _Request(
            rendered.method,
            rendered.url,
            rendered.params,
            headers,
            rendered.body,
            spec.timeout_seconds or self._config.tool_timeout_seconds,
        )
        url = request.checked(tool.name)
        limit = spec.max_response_bytes or DEFAULT_MAX_RESPONSE_BYTES
        response, too_large = await self._exchange(tool.name, url, request, limit)
        if credential is not None and response.status in (401, 403):
            raise _refused(credential, response)
        if too_large:  # the provider's answer, classified: the model is told why it has none
            return {"error": _over_limit(response, limit), "status": response.status}
        answer = _parse(_redacted(response, token))
        try:
            return template.pointed(answer, spec.response_pointer)
        except template.NothingAtPointer as exc:
            raise UnusableAnswer(
                f"{tool.name}: the provider answered {response.status}, but {exc}"
            ) from None

    async def _token(self, tool: Tool, credential: Credential | None) -> str | None:
        assert tool.http is not None
        if not tool.http.auth:
            return None
        if credential is None:
            raise NotSent(f"{tool.name} needs its connection's token and has none")
        return await credential.token()

    async def _exchange(
        self, name: str, url: yarl.URL, request: _Request, limit: int
    ) -> tuple[Answer, bool]:
        """The answer (its body read up to `limit` bytes) and whether it was over."""
        answered: aiohttp.ClientResponse | None = None
        try:
            async with self._guarded.get().request(
                request.method,
                url,
                params=request.params or None,
                headers=request.headers,
                data=request.data,
                timeout=http_session.timeout(request.seconds),
                allow_redirects=False,
            ) as answered:
                body = bytearray()
                async for chunk in answered.content.iter_any():
                    body.extend(chunk)
                    if len(body) > limit:
                        return Answer(answered.status, answered.headers, b""), True
                return Answer(
                    answered.status,
                    answered.headers,
                    bytes(body),
                    answered.charset,
                    answered.reason or "",
                ), False
        except netguard.DestinationRefused as exc:
            raise Blocked(f"{name}: {exc}") from None
        except _NOT_SENT as exc:
            raise NotSent(f"could not connect for {name}: {type(exc).__name__}") from exc
        except FAILED as exc:
            what = "no response" if answered is None else "response cut off"
            raise MaybeSent(f"{what} for {name}: {type(exc).__name__}") from exc


def _over_limit(response: Answer, limit: int) -> str:
    """Why an answer was not kept: its size (as declared; reading stops past the limit)."""
    declared = response.headers.get("Content-Length", "")
    size = f"{declared} bytes" if declared.isdigit() else f"more than {limit} bytes"
    return f"the response was {size}, over the tool's max_response_bytes {limit}: not kept"


@dataclasses.dataclass(frozen=True)
class _Request:
    """A registry tool's request, rendered."""

    method: str
    url: str
    params: Mapping[str, str]
    headers: Mapping[str, str]
    body: Any
    seconds: float

    @property
    def data(self) -> bytes | None:
        return None if self.body is None else encoded(self.body)

    def checked(self, name: str) -> yarl.URL:
        """The URL, once it parses, its body encodes and its host is not a literal
        address tools may not reach (a name is checked when it is resolved); a numeric
        IPv4 spelling (`127.1`) becomes the dotted address it was judged as."""
        try:
            url = yarl.URL(self.url)
            self.data  # noqa: B018 - a body that cannot be encoded is refused now
        except (ValueError, TypeError, UnicodeError) as exc:
            why = f"{name}: the request could not be built ({type(exc).__name__})"
            raise NotSent(why) from None
        try:
            netguard.refuse_literal(url.host)
        except netguard.DestinationRefused as exc:
            raise Blocked(f"{name}: {exc}") from None
        if url.host and (host := netguard.canonical_host(url.host)) != url.host:
            url = url.with_host(host)
        return url


def _redacted(response: Answer, token: str | None) -> Answer:
    """The response, with the token blanked should the provider echo it back."""
    if token and token.encode() in response.body:
        return dataclasses.replace(
            response, body=response.body.replace(token.encode(), b"[redacted]")
        )
    return response


def _refused(credential: Credential, response: Answer) -> Exception:
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


def _parse(response: Answer) -> Any:
    if response.status >= 400:
        raise ProviderError(
            response.status, _error_message(response), retry_after(response.headers)
        )
    if not response.body:
        return None
    try:
        return response.json()
    except ValueError:
        return response.text


def _error_message(response: Answer) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or response.reason
    if isinstance(body, dict):
        error = body.get("error") or body.get("message") or body.get("detail")
        if isinstance(error, dict):
            error = error.get("message") or json.dumps(error)
        if error:
            return str(error)[:500]
    return json.dumps(body)[:500]
