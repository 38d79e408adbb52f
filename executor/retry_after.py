"""How long a provider (model or tool) asks us to wait before asking again, in seconds.

Providers say it three ways, read in this order (as the OpenAI and Anthropic SDKs do):
`retry-after-ms` (milliseconds, a float), `retry-after` as seconds (a float), and
`retry-after` as an HTTP-date (RFC 9110: the wait is that time minus now).
"""

from __future__ import annotations

import datetime
import email.utils
import time
from collections.abc import Callable, Mapping


def retry_after(headers: Mapping[str, str], now: Callable[[], float] = time.time) -> float | None:
    """Seconds to wait, or None when the answer's headers (case-insensitive) give no usable
    wait (absent or garbage)."""
    millis = _number(headers.get("retry-after-ms"))
    if millis is not None:
        return millis / 1000.0
    raw = headers.get("retry-after")
    if not raw:
        return None
    seconds = _number(raw)
    if seconds is not None:
        return seconds
    return _http_date_wait(raw, now())


def _number(raw: str | None) -> float | None:
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return max(0.0, value) if value == value and value != float("inf") else None


def _http_date_wait(raw: str, now: float) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000": no zone given; an HTTP-date is GMT anyway
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, when.timestamp() - now)
