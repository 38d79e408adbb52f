"""The executor's side of rate limits: a token before every provider request, a park otherwise."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field

from executor import metrics as m
from executor.config import ExecutorConfig
from executor.ratelimit.rates import RateTable
from executor.ratelimit.token_bucket import (
    Bucket,
    LimiterUnavailable,
    TokenBuckets,
    connection_key,
    global_key,
)
from executor.tools.catalogue import Tool

log = logging.getLogger(__name__)

# A provider the agent version names no connection for is called unauthenticated, as the
# shared default account: its bucket is this one. Named connections get their own.
DEFAULT_CONNECTION = "default"
# A 429 without Retry-After, and the longest Retry-After taken at its word.
DEFAULT_RETRY_AFTER = 1.0
MAX_RETRY_AFTER = 3600.0


class RateLimited(Exception):
    """The request must not go out now: park the run for `wake_after` seconds.

    `cause` is `empty` (no token), `429` (the provider refused) or
    `unavailable` (Redis could not be asked). `note` is safe to record in a step.
    `after_send` is True when a write with the same key went out before, in
    the same delivery: then the call is not known to be unsent.
    """

    def __init__(self, cause: str, wake_after: float, note: str, after_send: bool = False) -> None:
        super().__init__(note)
        self.cause = cause
        self.wake_after = round(max(0.0, wake_after), 3)
        self.note = note
        self.after_send = after_send

    def after_send_if(self, went_out: bool) -> RateLimited:
        """This same refusal, marked as coming after a write that went out (if it did)."""
        self.after_send = self.after_send or went_out
        return self


@dataclass
class LimiterMetrics:
    """Counters since the executor started, logged at exit (and in executor/metrics.py)."""

    granted: int = 0
    empty: int = 0
    throttled: int = 0
    unavailable: int = 0

    def summary(self) -> str:
        return (
            f"tokens granted={self.granted} empty={self.empty} "
            f"provider_429={self.throttled} limiter_unavailable={self.unavailable}"
        )


@dataclass(frozen=True)
class LimiterSettings:
    """Rates, and how a 429 and an unreachable Redis are handled."""

    rates: RateTable = field(default_factory=RateTable)
    connection_id: str = DEFAULT_CONNECTION
    cooldown_seconds: float = 60.0
    penalty_factor: float = 0.5
    unavailable_backoff_start: float = 0.5
    unavailable_backoff_cap: float = 30.0


class RateLimiter:
    """Takes tokens from the (provider, connection) bucket and the provider's global one.

    Without Redis (`buckets` None) every request is admitted; a 429 still parks the run.
    """

    def __init__(
        self,
        buckets: TokenBuckets | None,
        settings: LimiterSettings | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._buckets = buckets
        self._settings = settings or LimiterSettings()
        self._rng = rng or random.Random()
        self._failures = 0  # Redis failures in a row, for the backoff
        self.metrics = LimiterMetrics()

    @classmethod
    def from_config(cls, config: ExecutorConfig) -> RateLimiter:
        """Buckets in `config.redis_url`'s Redis; none (no limits) without one."""
        if not config.redis_url:
            log.warning("REDIS_URL is not set: tool calls are not rate limited")
        settings = LimiterSettings(
            rates=config.rate_limits,
            cooldown_seconds=config.rate_cooldown_seconds,
            penalty_factor=config.rate_penalty_factor,
            unavailable_backoff_cap=config.redis_backoff_cap_seconds,
        )
        buckets = TokenBuckets.from_url(config.redis_url) if config.redis_url else None
        return cls(buckets, settings)

    @property
    def enabled(self) -> bool:
        return self._buckets is not None

    async def aclose(self) -> None:
        if self._buckets is not None:
            await self._buckets.aclose()

    def buckets_for(self, tool: Tool, connection_id: str | None = None) -> list[Bucket]:
        """The connection's bucket (first) and the provider's global one."""
        provider = tool.rate_bucket or tool.provider
        own = self._settings.rates.connection_rate(provider)
        shared = self._settings.rates.provider_rate(provider)
        return [
            Bucket(
                connection_key(provider, connection_id or self._settings.connection_id),
                own.per_second,
                own.burst,
            ),
            Bucket(global_key(provider), shared.per_second, shared.burst),
        ]

    async def admit(self, tool: Tool, connection_id: str | None = None) -> None:
        """Take a token for one request to the tool's provider (from `connection_id`'s
        bucket; the default connection's without one), or raise RateLimited."""
        if self._buckets is None:
            return
        try:
            taken = await self._buckets.take(self.buckets_for(tool, connection_id))
        except LimiterUnavailable as exc:
            raise self._unavailable(tool, exc) from exc
        self._failures = 0
        provider = tool.rate_bucket or tool.provider
        if taken.granted:
            self.metrics.granted += 1
            m.RATE_TOKENS.labels(provider, "granted").inc()
            return
        self.metrics.empty += 1
        m.RATE_TOKENS.labels(provider, "empty").inc()
        raise RateLimited(
            "empty",
            taken.wait_seconds,
            f"{provider} rate limit: next token in {taken.wait_seconds:g}s",
        )

    async def throttled(
        self, tool: Tool, retry_after: float | None, connection_id: str | None = None
    ) -> RateLimited:
        """The provider answered 429: honour Retry-After, slow the connection's bucket down."""
        self.metrics.throttled += 1
        m.RATE_TOKENS.labels(tool.rate_bucket or tool.provider, "429").inc()
        wait = min(MAX_RETRY_AFTER, DEFAULT_RETRY_AFTER if retry_after is None else retry_after)
        if self._buckets is not None:
            own = self.buckets_for(tool, connection_id)[0]
            s = self._settings
            try:
                wait = max(
                    wait,
                    await self._buckets.penalize(own, wait, s.penalty_factor, s.cooldown_seconds),
                )
            except LimiterUnavailable as exc:
                self._unavailable(tool, exc)  # counted and logged; Retry-After still holds
        provider = tool.rate_bucket or tool.provider
        log.warning(
            "%s answered 429 (Retry-After %s): parking for %.2fs", provider, retry_after, wait
        )
        return RateLimited("429", wait, f"{provider} answered 429: retry after {wait:g}s")

    def _unavailable(self, tool: Tool, exc: LimiterUnavailable) -> RateLimited:
        """Redis is unreachable: never send without a token; park with backoff, loudly."""
        self.metrics.unavailable += 1
        m.RATE_TOKENS.labels(tool.rate_bucket or tool.provider, "unavailable").inc()
        s = self._settings
        delay = min(s.unavailable_backoff_cap, s.unavailable_backoff_start * 2**self._failures)
        delay = self._rng.uniform(delay / 2, delay)
        self._failures = min(self._failures + 1, 30)
        log.warning(
            "rate limiter unavailable (%s): %s call parked for %.2fs [%s]",
            exc,
            tool.name,
            delay,
            self.metrics.summary(),
        )
        return RateLimited("unavailable", delay, f"rate limiter unavailable ({exc}): parked")
