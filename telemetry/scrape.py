"""What the control plane's and the executors' /metrics endpoints share: the latency
buckets of their histograms and the constant-time check of the scrape token."""

from __future__ import annotations

import hashlib
import hmac

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def token_matches(configured: str | None, offered: str) -> bool:
    """Constant-time comparison of the scrape token (digests, so lengths leak nothing)."""
    if not configured or not offered:
        return False
    want = hashlib.sha256(configured.encode()).digest()
    return hmac.compare_digest(want, hashlib.sha256(offered.encode()).digest())
