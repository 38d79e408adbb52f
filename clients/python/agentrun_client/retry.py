"""Retries on UNAVAILABLE only: exponential backoff with jitter, for a bounded time.

Every other code is an answer and is raised at once. A start is safe to retry: the client
always sends a request_id (it makes one when the caller gives none), so the control plane
returns the run it created the first time.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """`attempts` calls at most, waiting between them `initial` x 2^n seconds (capped at
    `maximum`), half of it random so that many clients do not retry in step."""

    attempts: int = 6
    initial: float = 0.2
    maximum: float = 5.0
    watch_for: float = 60.0
    """How long a watch keeps reconnecting while the control plane cannot be reached."""

    def channel_options(self) -> list[tuple[str, int]]:
        """gRPC reconnects a failed channel on its own backoff (1 s, then 1.6 times more, to
        2 minutes), failing calls at once meanwhile: kept within this policy's, so that a
        retry finds a control plane that came back. (Not grpc.min_reconnect_backoff_ms: gRPC
        takes it as the connect timeout too.)"""
        return [
            ("grpc.initial_reconnect_backoff_ms", int(self.initial * 1000)),
            ("grpc.max_reconnect_backoff_ms", int(self.maximum * 1000)),
        ]

    def delay(self, attempt: int) -> float:
        """The pause after failed attempt `attempt` (0-based)."""
        ceiling = min(self.maximum, self.initial * 2**attempt)
        return ceiling / 2 + random.uniform(0, ceiling / 2)


NO_RETRY = RetryPolicy(attempts=1, watch_for=0.0)
