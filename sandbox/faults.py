"""Faults tests arm on the sandbox servers: outages, rate limits, delays, lost responses.

Provider faults (`POST /_sandbox/faults` on the providers server), one JSON object each:

    {"provider": "chat", "mode": "drop_response", "path": "/chat/messages",
     "key_prefix": "<run_id>:", "after": 1, "count": 2, "probability": 0.2, "seed": 7,
     "delay_ms": 0, "status": 503, "retry_after": 2}

Only `provider` and `mode` are required; the rest narrow it down to an
endpoint, one run's calls (by key prefix), the calls after the first
`after`, a random fraction, or the next `count` hits. Modes: `error` (5xx,
no side effect), `rate_limit` (429 with Retry-After, no side effect),
`delay` (slow processing, then a normal answer), `drop_response` (the side
effect happens, then the connection breaks after `delay_ms`: the client sees
a reset, or a timeout if `delay_ms` outlasts its patience), `off`.
"""

import random
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

PROVIDER_MODES = ("drop_response", "delay", "error", "rate_limit")

# A dropped response hangs this long by default: longer than any sane client timeout.
DEFAULT_DELAY_MS = {"drop_response": 30_000, "delay": 1_000, "error": 0, "rate_limit": 0}


class FaultSpecError(ValueError):
    """A fault request with a bad field; the message names the field."""


class ConnectionDropped(Exception):
    """Raised by DroppedResponse so the server closes the connection mid-response."""


class DroppedResponse(Response):
    """Sends a status line, then breaks the connection: the client never gets a body.

    Uvicorn closes the transport when the app fails after the response started,
    which is the closest an ASGI app gets to "the reply was lost on the way".
    `sandbox.serve` keeps this deliberate failure out of the server's error log.
    """

    # Promise a body, then never send it: the client sees a truncated response.
    PROMISED_HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"64")]

    def __init__(self) -> None:
        super().__init__(status_code=200)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = {"type": "http.response.start", "status": 200, "headers": self.PROMISED_HEADERS}
        await send(start)
        raise ConnectionDropped("sandbox fault drop_response: connection closed before the body")


def retry_after_headers(seconds: float | None) -> dict[str, str]:
    if seconds is None:
        return {}
    return {"Retry-After": str(int(seconds)) if float(seconds).is_integer() else str(seconds)}


@dataclass
class ModelFaults:
    """Server-wide behaviour of the model sandbox; `count` limits `down` to the next N calls."""

    down: bool = False
    status: int = 503
    retry_after: float | None = None
    delay_ms: int = 0
    count: int | None = None

    @classmethod
    def from_json(cls, spec: Any) -> "ModelFaults":
        if not isinstance(spec, dict):
            raise FaultSpecError("expected a JSON object")
        down = spec.get("down", False)
        if not isinstance(down, bool):
            raise FaultSpecError("down must be a boolean")
        return cls(
            down=down,
            status=_status(spec, default=503),
            retry_after=optional_number(spec, "retry_after"),
            delay_ms=_delay_ms(spec, default=0),
            count=_count(spec),
        )

    def take_down(self) -> bool:
        """Whether this request fails; consumes one of `count` if limited."""
        if not self.down:
            return False
        if self.count is not None:
            self.count -= 1
            if self.count <= 0:
                self.down, self.count = False, None
        return True

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ProviderFault:
    """One armed fault: which calls it hits (`path`, `key_prefix`, `after`,
    `probability`) and how often it fires (`count`, None for ever)."""

    mode: str
    delay_ms: int
    status: int
    retry_after: float
    count: int | None  # None: every upcoming matching call
    path: str | None = None  # only this endpoint
    key_prefix: str | None = None  # only calls whose Idempotency-Key starts so (one run)
    after: int = 0  # let this many matching calls through first
    probability: float = 1.0  # fire on this fraction of the matching calls
    seed: int | None = None
    _rng: random.Random = field(default_factory=random.Random, repr=False)

    @property
    def delay_seconds(self) -> float:
        return self.delay_ms / 1000.0

    def matches(self, path: str, key: str | None) -> bool:
        if self.path is not None and path != self.path:
            return False
        return self.key_prefix is None or (key or "").startswith(self.key_prefix)

    def fire(self) -> bool:
        """Whether this matching call is hit; consumes `after` and `count`."""
        if self.after > 0:
            self.after -= 1
            return False
        if self.probability < 1.0 and self._rng.random() >= self.probability:
            return False
        if self.count is not None:
            self.count -= 1
        return True

    @property
    def used_up(self) -> bool:
        return self.count is not None and self.count <= 0

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "_rng"}


class FaultTable:
    """Faults armed per provider, and within one per endpoint or per run's key prefix.

    Arming a fault for the same (provider, mode, path, key_prefix) replaces
    it; `mode: "off"` disarms the provider's faults (only `path`'s, if given).
    The first armed fault that matches a call and fires applies to it.
    """

    def __init__(self, providers: list[str]) -> None:
        self._providers = set(providers)
        self._armed: dict[str, list[ProviderFault]] = {}

    def arm(self, spec: Any) -> None:
        if not isinstance(spec, dict):
            raise FaultSpecError("expected a JSON object")
        provider, mode = spec.get("provider"), spec.get("mode")
        if provider not in self._providers:
            raise FaultSpecError(f"provider must be one of {sorted(self._providers)}")
        path = _optional_string(spec, "path")
        if mode == "off":
            self._disarm(provider, path)
            return
        if mode not in PROVIDER_MODES:
            raise FaultSpecError(f"mode must be one of {[*PROVIDER_MODES, 'off']}")
        fault = _provider_fault(spec, mode, path)
        rules = [
            armed
            for armed in self._armed.get(provider, [])
            if (armed.mode, armed.path, armed.key_prefix)
            != (fault.mode, fault.path, fault.key_prefix)
        ]
        self._armed[provider] = [*rules, fault]

    def take(self, provider: str, path: str = "", key: str | None = None) -> ProviderFault | None:
        """The fault that hits this call, if any (consumed if counted)."""
        rules = self._armed.get(provider, [])
        for fault in rules:
            if fault.matches(path, key) and fault.fire():
                if fault.used_up:
                    rules.remove(fault)
                    if not rules:
                        del self._armed[provider]
                return fault
        return None

    def to_json(self) -> dict[str, Any]:
        return {name: [f.to_json() for f in rules] for name, rules in self._armed.items()}

    def clear(self) -> None:
        self._armed.clear()

    def _disarm(self, provider: str, path: str | None) -> None:
        kept = [f for f in self._armed.get(provider, []) if path is not None and f.path != path]
        if kept:
            self._armed[provider] = kept
        else:
            self._armed.pop(provider, None)


def _provider_fault(spec: dict[str, Any], mode: str, path: str | None) -> ProviderFault:
    retry_after = optional_number(spec, "retry_after")
    probability = optional_number(spec, "probability")
    if probability is not None and not 0 < probability <= 1:
        raise FaultSpecError("probability must be in (0, 1]")
    seed = spec.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise FaultSpecError("seed must be an integer")
    after = optional_whole(spec, "after") or 0
    return ProviderFault(
        mode=mode,
        delay_ms=_delay_ms(spec, default=DEFAULT_DELAY_MS[mode]),
        status=_status(spec, default=429 if mode == "rate_limit" else 503),
        retry_after=1 if retry_after is None else retry_after,
        count=_count(spec),
        path=path,
        key_prefix=_optional_string(spec, "key_prefix"),
        after=after,
        probability=1.0 if probability is None else float(probability),
        seed=seed,
        _rng=random.Random(seed),
    )


def _optional_string(spec: dict[str, Any], name: str) -> str | None:
    value = spec.get(name)
    if value is not None and (not isinstance(value, str) or not value):
        raise FaultSpecError(f"{name} must be a non-empty string")
    return value


def _status(spec: dict[str, Any], default: int) -> int:
    status = spec.get("status", default)
    if not isinstance(status, int) or isinstance(status, bool) or not 400 <= status <= 599:
        raise FaultSpecError("status must be an HTTP error status (400-599)")
    return status


def _delay_ms(spec: dict[str, Any], default: int) -> int:
    delay = optional_whole(spec, "delay_ms")
    return default if delay is None else delay


def optional_number(spec: dict[str, Any], field: str) -> float | None:
    """`spec[field]`: a number >= 0, or None when absent (FaultSpecError names it)."""
    value = spec.get(field)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise FaultSpecError(f"{field} must be a non-negative number")
    return value


def optional_whole(spec: dict[str, Any], field: str) -> int | None:
    """`spec[field]`: an integer >= 0, or None when absent (FaultSpecError names it)."""
    value = spec.get(field)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise FaultSpecError(f"{field} must be a non-negative integer")
    return value


def _count(spec: dict[str, Any]) -> int | None:
    count = spec.get("count")
    if count is None:
        return None
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise FaultSpecError("count must be a positive integer")
    return count
