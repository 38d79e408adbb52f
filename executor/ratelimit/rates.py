"""Bucket rates from configuration: `AGENTRUN_RATE_LIMITS="mail=5/s,crm=300/min:50"`.

Entries, comma-separated, are `NAME=COUNT/UNIT[:BURST]` with UNIT `s`, `min` or `h`:

    mail=5/s            each mail connection: 5 calls a second (burst 5)
    mail.global=100/s   the mail provider as a whole, over every connection
    *=20/s:40           any other provider's connections (default 50/s)
    *.global=1000/s     any other provider as a whole (default 500/s)

BURST (how many calls may go at once after a quiet spell) defaults to one
second's worth, at least 1.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

_UNITS = {"s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}
_ENTRY = re.compile(r"^(?P<name>\*|[a-z0-9_-]+)(?P<glob>\.global)?=(?P<rate>.+)$")
_RATE = re.compile(r"^(?P<count>\d+(\.\d+)?)/(?P<unit>[a-z]+)(:(?P<burst>\d+(\.\d+)?))?$")


@dataclass(frozen=True)
class Rate:
    """`per_second` tokens a second, at most `burst` saved up."""

    per_second: float
    burst: float

    @classmethod
    def parse(cls, text: str) -> Rate:
        """`5/s`, `300/min`, `5/s:10` (a burst of 10)."""
        match = _RATE.match(text.strip())
        if match is None or match["unit"] not in _UNITS:
            raise ValueError(f"rate {text!r} is not COUNT/UNIT[:BURST] with UNIT s, min or h")
        per_second = float(match["count"]) / _UNITS[match["unit"]]
        if per_second <= 0:
            raise ValueError(f"rate {text!r} must be above zero")
        burst = float(match["burst"]) if match["burst"] else float(max(1, math.ceil(per_second)))
        if burst < 1:
            raise ValueError(f"rate {text!r}: the burst must be at least 1")
        return cls(per_second, burst)


DEFAULT_CONNECTION_RATE = Rate(50.0, 50.0)
DEFAULT_GLOBAL_RATE = Rate(500.0, 500.0)


@dataclass(frozen=True)
class RateTable:
    """Per provider: the rate of each of its connections, and of the provider as a whole."""

    connection: Mapping[str, Rate] = field(default_factory=dict)
    provider: Mapping[str, Rate] = field(default_factory=dict)
    default_connection: Rate = DEFAULT_CONNECTION_RATE
    default_provider: Rate = DEFAULT_GLOBAL_RATE

    @classmethod
    def parse(cls, spec: str) -> RateTable:
        """The table an `AGENTRUN_RATE_LIMITS` value describes (defaults for the rest)."""
        connection: dict[str, Rate] = {}
        provider: dict[str, Rate] = {}
        for entry in filter(None, (part.strip() for part in spec.split(","))):
            match = _ENTRY.match(entry)
            if match is None:
                raise ValueError(f"rate limit {entry!r} is not NAME[.global]=COUNT/UNIT[:BURST]")
            table = provider if match["glob"] else connection
            table[match["name"]] = Rate.parse(match["rate"])
        return cls(
            connection={k: v for k, v in connection.items() if k != "*"},
            provider={k: v for k, v in provider.items() if k != "*"},
            default_connection=connection.get("*", DEFAULT_CONNECTION_RATE),
            default_provider=provider.get("*", DEFAULT_GLOBAL_RATE),
        )

    def connection_rate(self, provider: str) -> Rate:
        return self.connection.get(provider, self.default_connection)

    def provider_rate(self, provider: str) -> Rate:
        return self.provider.get(provider, self.default_provider)
