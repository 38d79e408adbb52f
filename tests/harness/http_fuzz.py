"""Hostile HTTP requests built from an app's route table (the HTTP twin of fuzzing.py).

`routes(app)` lists every route of a Starlette app, mounted ones included, with its
methods, so a new route is fuzzed without touching a test. `HttpFuzzer(seed)` makes the
parts of a request that servers get wrong: path values (NULs, dot segments, percent
escapes of invalid UTF-8, oversized, non-ASCII), query strings, headers (bearer tokens of
every shape, signature and cookie headers with junk), and bodies (random bytes under
a JSON or form content type, JSON of any shape and depth with huge numbers, NULs and lone
surrogate escapes, JSON nested 50,000 deep,
forms with a real CSRF token or none, bodies of megabytes).
"""

from __future__ import annotations

import json
import random
import re
import string
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from starlette.routing import BaseRoute, Mount, Route

PATH_VALUES = (
    "",
    "x",
    "ws",
    "00000000-0000-0000-0000-000000000000",
    "not-a-uuid",
    "%00",
    "a%00b",
    "..",
    "%2e%2e%2f%2e%2e",
    "é",
    "%ff%fe",
    "%C0%AF",
    "A" * 3000,
    "-1",
    "99999999999999999999",
    "<script>",
    "'; DROP TABLE runs;--",
    "{}",
    "null",
)
FIELD_NAMES = (
    "csrf",
    "key",
    "next",
    "workspace",
    "decision",
    "action",
    "reason",
    "note",
    "text",
    "request_id",
    "metadata",
    "state",
    "code",
    "q",
    "status",
    "agent",
    "from",
    "to",
    "after",
    "before",
    "limit",
    "from_seq",
    "token",
    "type",
    "event",
    "challenge",
    "payload",
    "\x00",
    "k" * 300,
)
HEADERS = (
    "X-Slack-Signature",
    "X-Slack-Request-Timestamp",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "X-Hub-Signature-256",
    "Stripe-Signature",
    "Cookie",
    "Origin",
    "Last-Event-ID",
    "Idempotency-Key",
    "X-Request-Id",
)
CONTENT_TYPES = (
    "application/json",
    "application/x-www-form-urlencoded",
    "text/plain",
    "multipart/form-data; boundary=zz",
    "application/json; charset=latin-1",
    "",
)


def routes(app_routes: list[BaseRoute], prefix: str = "") -> Iterator[tuple[str, set[str]]]:
    """(path template, methods) of every route; a mount without routes (static files) is
    one route taking any file name."""
    for route in app_routes:
        if isinstance(route, Mount):
            if route.routes:
                yield from routes(list(route.routes), prefix + route.path)
            else:
                yield prefix + route.path + "/{file}", {"GET"}
        elif isinstance(route, Route):
            yield prefix + route.path, set(route.methods or {"GET"})


@dataclass
class Request:
    method: str
    path: str
    params: dict[str, str]
    headers: dict[str, str | bytes]
    body: dict[str, Any] = field(default_factory=dict)  # httpx's content= / data= argument


class HttpFuzzer:
    def __init__(self, seed: int, path_values: tuple[str, ...] = (), nul: bool = True) -> None:
        """`nul`: text may hold NUL characters (refused early everywhere; without them a
        document gets past that check to the handler's own reading)."""
        self.rng = random.Random(seed)
        self.path_values = PATH_VALUES + path_values
        self.alphabet = string.printable + "é\u2028😀\ud7ff" + ("\x00" if nul else "")

    def text(self, longest: int = 600) -> str:
        size = self.rng.choice([0, 1, 5, 40, longest])
        return "".join(self.rng.choice(self.alphabet) for _ in range(size))

    def json(self, depth: int = 0) -> Any:
        pick = self.rng.randrange(9 if depth < 30 else 5)
        if pick == 0:
            return self.rng.choice([None, True, False])
        if pick == 1:
            return self.rng.choice([0, -1, 2**63, -(2**70), 1e308, 3.5, 10**40])
        if pick in (2, 3):
            # json.dumps writes a lone surrogate as its escape, which no text may hold.
            return self.rng.choice([self.text(200), "", "message", "url_verification", "\udfff"])
        if pick in (4, 5):
            return [self.json(depth + 1) for _ in range(self.rng.randrange(4))]
        size = self.rng.randrange(5)
        return {self.rng.choice(FIELD_NAMES): self.json(depth + 1) for _ in range(size)}

    def request(self, template: str, methods: set[str], csrf: tuple[str, ...]) -> Request:
        """A request for the route `template`; `csrf`: tokens a form may carry."""
        rng = self.rng
        path = re.sub(r"{\w+(?::\w+)?}", lambda _: rng.choice(self.path_values), template)
        extra = {"PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"} if rng.random() < 0.15 else set()
        method = rng.choice(sorted(methods | extra))
        params = {rng.choice(FIELD_NAMES): self.text(100) for _ in range(rng.randrange(4))}
        headers: dict[str, str | bytes] = {
            name: rng.choice([*self.path_values, self.text(100)])[:200]
            for name in HEADERS
            if rng.random() < 0.08
        }
        if rng.random() < 0.2:  # a header value past ASCII, as raw bytes on the wire
            headers[rng.choice(HEADERS)] = "é²".encode("latin-1")
        return Request(method, path, params, headers, self._body(headers, csrf))

    def _body(self, headers: dict[str, str | bytes], csrf: tuple[str, ...]) -> dict[str, Any]:
        rng = self.rng
        kind = rng.randrange(5)
        if kind == 0:
            headers["Content-Type"] = rng.choice(CONTENT_TYPES)
            return {"content": rng.randbytes(rng.choice([0, 10, 1000]))}
        if kind == 1:
            headers["Content-Type"] = "application/json"
            if rng.random() < 0.1:  # nested past Python's JSON reader
                return {"content": b"[" * 50_000 + b"]" * 50_000}
            return {"content": json.dumps(self.json()).encode()}
        if kind == 2:
            form = {rng.choice(FIELD_NAMES): self.text(500) for _ in range(rng.randrange(5))}
            if csrf and rng.random() < 0.6:
                form["csrf"] = rng.choice(csrf)
            return {"data": form}
        if kind == 3:
            headers["Content-Type"] = rng.choice(CONTENT_TYPES[:2])
            return {"content": b"x" * rng.choice([1 << 20, 3 << 20])}
        return {}
