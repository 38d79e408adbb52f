"""When to ask a failing model provider again, and when to stop asking."""

from __future__ import annotations

import random
from dataclasses import dataclass

# A run admitted without a budget (an older control plane sends 0) gets this one.
DEFAULT_BUDGET = 30


@dataclass(frozen=True)
class ModelRetry:
    """Exponential backoff with jitter between model calls that failed (down, 5xx, 429).

    Each failure parks the run (wait_reason `model`) for `delay()`; once
    `budget` failures in a row were parked, the next one fails the run.
    """

    start: float = 1.0
    cap: float = 60.0
    max_retry_after: float = 3600.0

    def delay(self, failures: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to park after `failures` parks in a row already (never under Retry-After)."""
        delay = min(self.cap, self.start * 2 ** min(failures, 62))
        delay = rng.uniform(delay / 2, delay)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.max_retry_after))
        return round(delay, 3)

    @staticmethod
    def budget(limit: int) -> int:
        """The run's budget: its limit, or the default when it came without one (0)."""
        return limit or DEFAULT_BUDGET

    @staticmethod
    def give_up(budget: int, reason: str) -> str:
        """The failed run's error: what kept failing, and how often it was tried."""
        return (
            f"model unavailable after {budget + 1} attempts (model_retry_budget {budget}): {reason}"
        )
