"""Rate configuration, the limiter's decisions, and the tool client that asks it (no Redis)."""

from __future__ import annotations

import json
import random

import pytest

from executor import steps
from executor.config import ExecutorConfig
from executor.ratelimit import parks
from executor.ratelimit.limiter import LimiterSettings, RateLimited, RateLimiter
from executor.ratelimit.rates import DEFAULT_CONNECTION_RATE, Rate, RateTable
from executor.ratelimit.token_bucket import Bucket, LimiterUnavailable, Take
from executor.ratelimit.tool_client import RateLimitedToolClient
from executor.replay import PARK, RESULT, Entry
from executor.tools.catalogue import Catalogue
from executor.tools.delivery import ToolDelivery
from tests.harness.http_stub import STALL, Stub, reply, serving

CATALOGUE = Catalogue.load()
SEND_EMAIL = CATALOGUE.get("send_email")


@pytest.mark.parametrize(
    ("text", "rate", "burst"),
    [
        ("5/s", 5, 5),
        ("300/min", 5, 5),
        ("1/min", 1 / 60, 1),
        ("5/s:10", 5, 10),
        ("0.5/s", 0.5, 1),
        ("7200/h", 2, 2),
    ],
)
def test_rates_parse(text, rate, burst):
    assert Rate.parse(text) == Rate(pytest.approx(rate), burst)


@pytest.mark.parametrize("text", ["5", "5/day", "0/s", "-1/s", "5/s:0", "five/s"])
def test_bad_rates_are_refused(text):
    with pytest.raises(ValueError):
        Rate.parse(text)


def test_the_rate_table_has_connection_and_global_rates_with_defaults():
    table = RateTable.parse("mail=5/s, crm=300/min:50, mail.global=100/s, *=20/s, *.global=200/s")
    assert table.connection_rate("mail") == Rate(5, 5)
    assert table.connection_rate("crm") == Rate(5, 50)
    assert table.connection_rate("echo") == Rate(20, 20)
    assert table.provider_rate("mail") == Rate(100, 100)
    assert table.provider_rate("crm") == Rate(200, 200)
    assert RateTable.parse("").connection_rate("mail") == DEFAULT_CONNECTION_RATE
    with pytest.raises(ValueError, match="NAME"):
        RateTable.parse("mail:5/s")


def test_the_executor_reads_its_limits_from_the_environment():
    env = {"AGENTRUN_RATE_LIMITS": "mail=2/s", "REDIS_URL": "redis://secret@host/0"}
    config = ExecutorConfig.from_env(env)
    assert config.rate_limits.connection_rate("mail") == Rate(2, 2)
    assert "secret" not in repr(config)
    with pytest.raises(ValueError, match="AGENTRUN_RATE_LIMITS"):
        ExecutorConfig.from_env({"AGENTRUN_RATE_LIMITS": "mail=fast"})


class Buckets:
    """A scripted stand-in for TokenBuckets: answers takes in order, records penalties."""

    def __init__(self, *takes: Take | Exception) -> None:
        self.takes = list(takes)
        self.taken: list[list[Bucket]] = []
        self.penalized: list[tuple[Bucket, float]] = []
        self.penalty_wait = 0.0

    async def take(self, buckets, cost=1):
        self.taken.append(list(buckets))
        answer = self.takes.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def penalize(self, bucket, retry_after, factor, cooldown):
        self.penalized.append((bucket, retry_after))
        if isinstance(self.penalty_wait, Exception):
            raise self.penalty_wait
        return max(retry_after, self.penalty_wait)

    async def aclose(self):
        pass


def limiter(buckets: Buckets | None) -> RateLimiter:
    settings = LimiterSettings(
        rates=RateTable.parse("mail=5/s"),
        unavailable_backoff_start=1.0,
        unavailable_backoff_cap=8.0,
    )
    return RateLimiter(buckets, settings, rng=random.Random(1))  # type: ignore[arg-type]


async def test_a_token_comes_from_the_connection_and_the_provider_bucket():
    buckets = Buckets(Take(True, 0))
    await limiter(buckets).admit(SEND_EMAIL)
    conn, provider = buckets.taken[0]
    assert conn.key == "agentrun:ratelimit:{mail}:connection:default"
    assert provider.key == "agentrun:ratelimit:{mail}:global"
    assert (conn.rate, conn.burst) == (5, 5)


async def test_an_empty_bucket_raises_with_the_time_a_token_is_due():
    rl = limiter(Buckets(Take(False, 0.4)))
    with pytest.raises(RateLimited) as caught:
        await rl.admit(SEND_EMAIL)
    assert (caught.value.cause, caught.value.wake_after) == ("empty", 0.4)
    assert rl.metrics.empty == 1


async def test_an_unreachable_redis_parks_with_growing_backoff_and_is_counted():
    down = LimiterUnavailable("ConnectionError")
    rl = limiter(Buckets(down, down, down, down, down, Take(True, 0), down))
    waits = []
    for _ in range(5):
        with pytest.raises(RateLimited) as caught:
            await rl.admit(SEND_EMAIL)
        assert caught.value.cause == "unavailable"
        waits.append(caught.value.wake_after)
    assert waits[0] <= 1.0 and 4.0 <= waits[3] <= 8.0 and waits[4] <= 8.0
    await rl.admit(SEND_EMAIL)  # back: the backoff starts over
    with pytest.raises(RateLimited) as caught:
        await rl.admit(SEND_EMAIL)
    assert caught.value.wake_after <= 1.0
    assert rl.metrics.unavailable == 6 and "limiter_unavailable=6" in rl.metrics.summary()


async def test_a_429_blocks_the_connection_bucket_for_retry_after():
    buckets = Buckets()
    buckets.penalty_wait = 3.4
    limited = await limiter(buckets).throttled(SEND_EMAIL, 3.0)
    assert (limited.cause, limited.wake_after) == ("429", 3.4)
    bucket, retry_after = buckets.penalized[0]
    assert bucket.key.endswith(":connection:default") and retry_after == 3.0


async def test_a_429_still_honours_retry_after_when_redis_is_down():
    buckets = Buckets()
    buckets.penalty_wait = LimiterUnavailable("TimeoutError")  # type: ignore[assignment]
    rl = limiter(buckets)
    assert (await rl.throttled(SEND_EMAIL, 3.0)).wake_after == 3.0
    assert rl.metrics.unavailable == 1


async def test_without_redis_every_request_is_admitted():
    await limiter(None).admit(SEND_EMAIL)


def tool_client(buckets: Buckets, provider: Stub) -> RateLimitedToolClient:
    config = ExecutorConfig(providers_url=provider.url, tool_timeout_seconds=0.3)
    return RateLimitedToolClient(config, limiter(buckets))


async def test_no_token_no_request_and_a_429_is_a_park_not_a_retry():
    slow_down = reply(429, {"error": "slow down"}, headers={"Retry-After": "3"})
    async with serving(lambda r: slow_down) as provider:
        client = tool_client(Buckets(Take(False, 0.2), Take(True, 0)), provider)
        delivery = ToolDelivery(client)
        args = {"to": "a@example.com", "subject": "s", "body": "b"}
        with pytest.raises(RateLimited, match="next token"):
            await delivery.send(SEND_EMAIL, args, "run:2", lambda: None)
        assert provider.seen == []
        # With a token it goes out once; the 429 parks the run instead of sleeping inline.
        with pytest.raises(RateLimited) as caught:
            await delivery.send(SEND_EMAIL, args, "run:2", lambda: None)
        await client.aclose()
    assert len(provider.seen) == 1 and caught.value.cause == "429"
    assert caught.value.wake_after == 3.0


def entry(seq: int, kind: int, payload: dict) -> Entry:
    return Entry(seq, kind, 0, payload)


def test_a_call_parked_unsent_may_go_out_only_under_the_next_lease():
    limited = RateLimited("empty", 0.5, "no token")
    park = parks.park_step(5, limited, call_seq=4, epoch=7)
    logged = [entry(4, 3, {}), entry(5, PARK, json.loads(park.payload_json))]
    assert logged[-1].payload["wait_reason"] == "rate"
    assert steps.known_unsent(logged, 4, epoch=8)
    assert not steps.known_unsent(logged, 4, epoch=9)  # someone held it since: it may have gone out
    assert not steps.known_unsent(logged, 3, epoch=8)
    assert not steps.known_unsent([*logged, entry(6, RESULT, {})], 4, epoch=8)


async def test_a_lookup_refused_after_a_send_that_may_have_applied_is_not_unsent():
    async def no_wait(seconds: float) -> None:
        pass

    args = {"to": "a@example.com", "subject": "s", "body": "b"}
    assert SEND_EMAIL.call_class == "lookup"
    async with serving(lambda r: STALL) as provider:  # no answer: the send may have applied
        client = tool_client(Buckets(Take(True, 0), Take(False, 0.5)), provider)
        delivery = ToolDelivery(client, attempts=1, sleep=no_wait)
        with pytest.raises(RateLimited) as caught:
            await delivery.send(SEND_EMAIL, args, "run:4", lambda: None)
        await client.aclose()
    assert caught.value.after_send
    park = json.loads(parks.park_step(5, caught.value, 4, epoch=2).payload_json)
    assert "unsent_call_seq" not in park  # resumed by its class: looked up, not sent again
