"""The HTTP side every model adapter shares: one POST, and what a failed answer means.

Transient (the run parks and asks again, `ModelUnavailable`): a connection
failure or timeout, 408, 409, 429, any 5xx (Anthropic's 529 `overloaded_error`
among them) and a garbled body. Everything else in 4xx is `ModelRejected`: the
run fails with the reason. A 429 for an exhausted quota or credit balance
(`insufficient_quota`, `billing_error`) is rejected too: it does not pass with
time, and a run parked on it would only spend its retry budget.
An `x-should-retry: true|false` header, which both SDKs obey, overrides the status.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from executor import http_session
from executor.http_session import FAILED, JSON_TYPE, Answer, encoded, read
from executor.models.base import ModelRejected, ModelUnavailable
from executor.retry_after import retry_after

TRANSIENT_STATUSES = frozenset({408, 409, 429})
# Error types (or codes) that say the account cannot pay for the call: never transient.
EXHAUSTED = frozenset({"insufficient_quota", "billing_error", "billing_hard_limit_reached"})


@dataclass(frozen=True)
class ProviderError:
    """A failed answer's status, error type or code, and message."""

    status: int
    kind: str
    message: str


class ProviderHttp:
    """The HTTP client of one provider endpoint (executor/http_session.py: aiohttp, one
    keep-alive pool made in the running loop); `timeout_seconds` is its default."""

    def __init__(self, timeout_seconds: float, secret: str) -> None:
        self._secret = secret
        self._timeout = timeout_seconds
        # A model request is a send too: it takes the send horizon's last-moment check.
        # No connection limit: a held run makes one model call at a time, so AGENTRUN_CAPACITY
        # already bounds them. aiohttp's default 100 made every run past the 100th wait for a
        # pooled connection, and that wait counts against the connect timeout: 1,000 runs held
        # on a 5-10 s model made 19 actions/s, as many as 256 did, and a run queued behind
        # 60 s of others' calls timed out (bench/held.py).
        self._http = http_session.LazySession(
            timeout_seconds, request_class=http_session.LastMoment, connections=0
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def post(
        self,
        url: str,
        body: Mapping[str, Any],
        headers: Mapping[str, str],
        timeout_seconds: float | None = None,
    ) -> Answer:
        """POST the body and read the answer; the exception an error answer stands for
        (`failure`), ModelUnavailable when the provider cannot be reached."""
        try:
            async with self._http.get().post(
                url,
                data=encoded(body),
                headers={**headers, **JSON_TYPE},
                timeout=self._timeout_of(timeout_seconds),
                allow_redirects=False,
            ) as response:
                answer = await read(response)
        except FAILED as exc:
            # Only the exception's class: its text may carry the URL, never headers,
            # but there is nothing in it worth the risk.
            raise ModelUnavailable(f"model provider unreachable: {type(exc).__name__}") from exc
        if answer.status >= 400:
            raise self.failure(answer, error_of(answer))
        return answer

    @contextlib.asynccontextmanager
    async def stream(
        self,
        url: str,
        body: Mapping[str, Any],
        headers: Mapping[str, str],
        timeout_seconds: float | None = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """POST the body and read the answer as it comes; an error answer is read whole
        and raised as `failure`; ModelUnavailable when the provider cannot be reached or
        the stream breaks."""
        try:
            async with self._http.get().post(
                url,
                data=encoded(body),
                headers={**headers, **JSON_TYPE},
                timeout=self._timeout_of(timeout_seconds),
                allow_redirects=False,
            ) as response:
                if response.status >= 400:
                    answer = await read(response)
                    raise self.failure(answer, error_of(answer))
                yield response
        except FAILED as exc:
            raise ModelUnavailable(f"model provider unreachable: {type(exc).__name__}") from exc

    def _timeout_of(self, seconds: float | None) -> aiohttp.ClientTimeout:
        return http_session.timeout(seconds or self._timeout)

    def failure(self, response: Answer, error: ProviderError) -> Exception:
        """The exception a failed answer (status >= 400) stands for."""
        message = self.redact(error.message)
        label = f"{error.status} {error.kind}".strip()
        if error.kind in EXHAUSTED:
            return ModelRejected(f"model provider quota or credit exhausted ({label}): {message}")
        if _transient(response):
            return ModelUnavailable(
                f"model provider returned {label}" + (f": {message}" if message else ""),
                retry_after(response.headers),
            )
        return ModelRejected(f"model provider rejected the request ({label}): {message}")

    def redact(self, text: str) -> str:
        return text.replace(self._secret, "[redacted]") if self._secret else text


def _transient(response: Answer) -> bool:
    hint = response.headers.get("x-should-retry", "").lower()
    if hint in ("true", "false"):
        return hint == "true"
    return response.status in TRANSIENT_STATUSES or response.status >= 500


def json_body(response: Answer) -> Any:
    """The parsed body, or None when it is not JSON."""
    try:
        return response.json()
    except (ValueError, json.JSONDecodeError):
        return None


def error_of(response: Answer) -> ProviderError:
    """Status, type and message of an error body, OpenAI's or Anthropic's shape:
    `{"error": {"message", "type", "code"}}` / `{"type": "error", "error": {"type", "message"}}`."""
    body = json_body(response)
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        kind = error.get("code") if error.get("code") in EXHAUSTED else error.get("type")
        return ProviderError(
            response.status, str(kind or ""), str(error.get("message") or "")[:300]
        )
    text = response.text[:300] if body is None else str(error or body)[:300]
    return ProviderError(response.status, "", text)
