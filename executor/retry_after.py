"""The `Retry-After` a provider (model or tool) sends with a 429 or 503, in seconds."""

from __future__ import annotations

import httpx


def retry_after(response: httpx.Response) -> float | None:
    """Seconds to wait, or None when the header is absent or not a number of seconds."""
    raw = response.headers.get("retry-after")
    try:
        return max(0.0, float(raw)) if raw else None
    except ValueError:
        return None
