"""What the control plane's and the executors' /metrics endpoints share: the latency
buckets of their histograms, the cached lookup of a labelled child and the constant-time
check of the scrape token."""

from __future__ import annotations

import functools
import hashlib
import hmac
from typing import Any

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@functools.cache
def labelled(metric: Any, *values: str) -> Any:
    """The metric's child for these label values, looked up once: `labels()` takes a lock
    and builds its key on every call, and the hot paths count every commit and every run
    a claim leases. A child, once made, is the same object for good (none is removed)."""
    return metric.labels(*values)


def token_matches(configured: str | None, offered: str) -> bool:
    """Constant-time comparison of the scrape token (digests, so lengths leak nothing)."""
    if not configured or not offered:
        return False
    want = hashlib.sha256(configured.encode()).digest()
    return hmac.compare_digest(want, hashlib.sha256(offered.encode()).digest())
