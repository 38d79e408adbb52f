"""Faults tests arm on the sandbox servers: outages, rate limits, delays, lost responses."""

from dataclasses import asdict, dataclass
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
            retry_after=_optional_number(spec, "retry_after"),
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
    mode: str
    delay_ms: int
    status: int
    retry_after: float
    count: int | None  # None: every upcoming call

    @property
    def delay_seconds(self) -> float:
        return self.delay_ms / 1000.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class FaultTable:
    """At most one armed fault per provider, consumed call by call."""

    def __init__(self, providers: list[str]) -> None:
        self._providers = set(providers)
        self._armed: dict[str, ProviderFault] = {}

    def arm(self, spec: Any) -> None:
        if not isinstance(spec, dict):
            raise FaultSpecError("expected a JSON object")
        provider, mode = spec.get("provider"), spec.get("mode")
        if provider not in self._providers:
            raise FaultSpecError(f"provider must be one of {sorted(self._providers)}")
        if mode == "off":
            self._armed.pop(provider, None)
            return
        if mode not in PROVIDER_MODES:
            raise FaultSpecError(f"mode must be one of {[*PROVIDER_MODES, 'off']}")
        retry_after = _optional_number(spec, "retry_after")
        self._armed[provider] = ProviderFault(
            mode=mode,
            delay_ms=_delay_ms(spec, default=DEFAULT_DELAY_MS[mode]),
            status=_status(spec, default=429 if mode == "rate_limit" else 503),
            retry_after=1 if retry_after is None else retry_after,
            count=_count(spec),
        )

    def take(self, provider: str) -> ProviderFault | None:
        fault = self._armed.get(provider)
        if fault is not None and fault.count is not None:
            fault.count -= 1
            if fault.count <= 0:
                del self._armed[provider]
        return fault

    def to_json(self) -> dict[str, Any]:
        return {name: fault.to_json() for name, fault in self._armed.items()}

    def clear(self) -> None:
        self._armed.clear()


def _status(spec: dict[str, Any], default: int) -> int:
    status = spec.get("status", default)
    if not isinstance(status, int) or isinstance(status, bool) or not 400 <= status <= 599:
        raise FaultSpecError("status must be an HTTP error status (400-599)")
    return status


def _delay_ms(spec: dict[str, Any], default: int) -> int:
    delay = spec.get("delay_ms")
    if delay is None:
        return default
    if not isinstance(delay, int) or isinstance(delay, bool) or delay < 0:
        raise FaultSpecError("delay_ms must be a non-negative integer")
    return delay


def _optional_number(spec: dict[str, Any], field: str) -> float | None:
    value = spec.get(field)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise FaultSpecError(f"{field} must be a non-negative number")
    return value


def _count(spec: dict[str, Any]) -> int | None:
    count = spec.get("count")
    if count is None:
        return None
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise FaultSpecError("count must be a positive integer")
    return count
