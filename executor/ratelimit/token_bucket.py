"""Token buckets in Redis, taken all-or-nothing by one atomic script (token_bucket.lua)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisError

from executor.ratelimit import resp
from executor.ratelimit.resp import RespClient, RespError

SCRIPT = Path(__file__).with_name("token_bucket.lua").read_text()
SCRIPT_SHA = hashlib.sha1(SCRIPT.encode()).hexdigest()  # what EVALSHA names it by
KEY_PREFIX = "agentrun:ratelimit"
# Redis answers in well under a millisecond; waiting longer only holds a run.
DEFAULT_TIMEOUT_SECONDS = 0.5


def connection_key(provider: str, connection_id: str) -> str:
    """The bucket of one connection (account) at a provider.

    The braces make Redis Cluster keep a provider's buckets in one slot, so
    the script can take from a connection's and the provider's bucket at once.
    """
    return f"{KEY_PREFIX}:{{{provider}}}:connection:{connection_id}"


def global_key(provider: str) -> str:
    """The provider's bucket for the platform's own quota (our OAuth app), shared by all."""
    return f"{KEY_PREFIX}:{{{provider}}}:global"


@dataclass(frozen=True)
class Bucket:
    """A bucket: `rate` tokens a second, at most `burst` saved up."""

    key: str
    rate: float
    burst: float


@dataclass(frozen=True)
class Take:
    """What a take got: a token, or how long until one is there."""

    granted: bool
    wait_seconds: float


class LimiterUnavailable(Exception):
    """Redis could not be asked: nothing is known about the buckets."""


class TokenBuckets:
    """The buckets of one Redis server (or cluster), through the script."""

    def __init__(self, client: redis.Redis | RespClient) -> None:
        self._client = client
        self._sha = SCRIPT_SHA

    @classmethod
    def from_url(cls, url: str, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> TokenBuckets:
        """A client that fails fast: no retries of its own, short timeouts. Plain
        `redis://` and `unix://` URLs get the lean client (executor/ratelimit/resp.py);
        anything else (TLS) redis-py."""
        if urlsplit(url).scheme in resp.SCHEMES:
            return cls(RespClient(url, timeout))
        client = redis.Redis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
        )
        return cls(client)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def take(self, buckets: Sequence[Bucket], cost: float = 1) -> Take:
        """Take `cost` tokens from every bucket, or none when one of them is short."""
        args: list[str | float] = ["take", cost]
        for bucket in buckets:
            args += [bucket.rate, bucket.burst]
        granted, wait_ms = await self._run([b.key for b in buckets], args)
        return Take(bool(granted), wait_ms / 1000)

    async def penalize(
        self, bucket: Bucket, retry_after: float, factor: float, cooldown: float
    ) -> float:
        """After a 429: block the bucket for `retry_after` s and slow it by `factor`
        for `cooldown` s. Returns how long the refused caller waits, in seconds."""
        args: list[str | float] = [
            "penalize",
            round(retry_after * 1000),
            factor,
            round(cooldown * 1000),
            bucket.rate,
            bucket.burst,
        ]
        _, wait_ms = await self._run([bucket.key], args)
        return wait_ms / 1000

    async def _run(self, keys: list[str], args: list[str | float]) -> tuple[int, int]:
        try:
            try:
                reply = await self._evalsha(keys, args)
            except (NoScriptError, RespError) as exc:
                if "NOSCRIPT" not in str(exc):
                    raise
                # A fresh or flushed server: load the script, once, and ask again.
                await self._load()
                reply = await self._evalsha(keys, args)
        except (RedisError, RespError, OSError) as exc:
            # The class only: a message may name the server, and it ends up in a step.
            raise LimiterUnavailable(type(exc).__name__) from exc
        return int(reply[0]), int(reply[1])

    async def _evalsha(self, keys: list[str], args: list[str | float]) -> Any:
        return await self._client.evalsha(self._sha, len(keys), *keys, *args)

    async def _load(self) -> None:
        loaded = await self._client.script_load(SCRIPT)
        if isinstance(loaded, bytes):
            loaded = loaded.decode()
        self._sha = str(loaded)
