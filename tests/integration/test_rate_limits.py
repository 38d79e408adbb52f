"""Shared rate limits: the token-bucket script on real Redis, then real executors against it.

The executor tests run the control plane, executors, Redis and the provider sandbox as
real processes, and judge by what the provider recorded (its own clock, per request).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import redis.asyncio as redis

from agentrun.v1 import run_pb2
from executor.ratelimit.token_bucket import Bucket, TokenBuckets, connection_key, global_key
from tests.harness.agentrun_api import Api, clear_faults, sandbox_requests, set_fault
from tests.harness.invariants import assert_log_well_formed, assert_no_reask
from tests.harness.waiting import eventually

RATE, BURST = 2.0, 2  # the mail connection's limit in the executor tests
# The provider logs a request a moment after its token was taken (a Redis reply, the HTTP
# hop, the handler): allow that much jitter when comparing its clock with the bucket's.
JITTER = 0.25


async def forget_buckets(url: str) -> None:
    """Delete every rate-limit bucket (a fresh client: a test may have restarted the server)."""
    client = redis.Redis.from_url(url)
    try:
        keys = [key async for key in client.scan_iter("agentrun:ratelimit:*")]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


@pytest.fixture
async def redis_client(redis_server):
    """The session Redis, with no rate-limit state left from another test (before or after)."""
    await forget_buckets(redis_server.url)
    client = redis.Redis.from_url(redis_server.url)
    yield client
    await client.aclose()
    await forget_buckets(redis_server.url)


@pytest.fixture
async def buckets(redis_server, redis_client):
    tb = TokenBuckets.from_url(redis_server.url)
    yield tb
    await tb.aclose()


def fresh(provider_rate: float = 1000, burst: float = 1000) -> tuple[str, Bucket]:
    """A provider name no other test uses, and its global bucket."""
    provider = f"p{uuid.uuid4().hex[:8]}"
    return provider, Bucket(global_key(provider), provider_rate, burst)


# --- the script, on real Redis ----------------------------------------------------------------


async def test_a_burst_then_callers_get_successive_wake_times(buckets):
    provider, shared = fresh()
    own = Bucket(connection_key(provider, "default"), 10, 3)
    takes = [await buckets.take([own, shared]) for _ in range(6)]
    assert [t.granted for t in takes] == [True, True, True, False, False, False]
    waits = [t.wait_seconds for t in takes[3:]]
    # One token every 0.1 s: the three callers come back one token apart, not together.
    assert waits[0] <= 0.1 and 0.08 <= waits[1] - waits[0] <= 0.12
    assert 0.08 <= waits[2] - waits[1] <= 0.12


async def test_the_provider_bucket_binds_across_connections_all_or_nothing(buckets, redis_client):
    provider, shared = fresh(provider_rate=1, burst=2)
    # The connections refill slowly enough that a busy machine's pauses between the takes
    # give back no token worth counting: what is left of `a` is what the takes spent.
    a = Bucket(connection_key(provider, "a"), 0.01, 100)
    b = Bucket(connection_key(provider, "b"), 0.01, 100)
    assert [(await buckets.take([c, shared])).granted for c in (a, b, a, b)] == [
        True,
        True,
        False,
        False,
    ]
    # The refused takes did not spend the connections' tokens.
    assert float(await redis_client.hget(a.key, "tokens")) == pytest.approx(99, abs=0.5)


async def test_concurrent_takes_never_get_more_than_the_bucket_holds(buckets):
    provider, shared = fresh()
    own = Bucket(connection_key(provider, "default"), 0.01, 5)
    takes = await asyncio.gather(*(buckets.take([own, shared]) for _ in range(50)))
    assert sum(t.granted for t in takes) == 5


async def test_a_429_blocks_the_bucket_and_halves_its_rate_for_the_cool_down(buckets):
    provider, shared = fresh()
    own = Bucket(connection_key(provider, "default"), 10, 1)
    wait = await buckets.penalize(own, retry_after=1.0, factor=0.5, cooldown=30)
    assert 1.15 <= wait <= 1.25  # the block, then one token at the halved rate (0.2 s)
    first, second = [await buckets.take([own, shared]) for _ in range(2)]
    assert not first.granted and first.wait_seconds >= 1.0
    assert 0.18 <= second.wait_seconds - first.wait_seconds <= 0.22


# --- real executors -------------------------------------------------------------------------


@pytest.fixture
async def stack(db_url, control_plane, redis_client):
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url)
    yield cp, api
    await api.close()


def provider_log(url: str, run_ids: list[str], path: str | None = None) -> list[dict]:
    """The provider requests of these runs (their keys start with the run id), in order."""
    return [
        r
        for r in sandbox_requests(url)
        if (r["idempotency_key"] or "").split(":")[0] in run_ids
        and (path is None or r["path"] == path)
    ]


def assert_within_rate(times: list[float], rate: float, burst: float) -> None:
    """No stretch of the provider's log holds more requests than the bucket allows."""
    times = sorted(times)
    for i, start in enumerate(times):
        for j in range(i, len(times)):
            span = times[j] - start
            allowed = burst + rate * (span + JITTER)
            assert j - i + 1 <= allowed, f"{j - i + 1} requests within {span:.3f}s"


async def rate_parks(api: Api, run_ids: list[str]) -> dict[str, list[dict]]:
    """Each run's rate-limit park steps."""
    out = {}
    for run_id in run_ids:
        steps = await api.steps(run_id)
        out[run_id] = [
            s.payload for s in steps if s.kind == "park" and s.payload.get("wait_reason") == "rate"
        ]
    return out


async def parked_on_rate(db, run_ids: list[str]) -> int:
    return await db.fetchval(
        "SELECT count(*) FROM runs WHERE run_id = ANY($1::uuid[]) AND wait_reason = 'rate'",
        run_ids,
    )


async def test_five_agents_through_one_connection_at_ten_times_its_rate(
    stack, db, executor_factory, sandbox_model, sandbox_providers
):
    cp, api = stack
    senders = [f"sender-{i}" for i in range(5)]
    for agent in senders:
        await api.publish(agent, "demo", ["crm_lookup", "send_email"])
    await api.publish("echoer", "echo_input", ["echo"])
    executor_factory(cp, count=2, AGENTRUN_RATE_LIMITS=f"mail={RATE:g}/s:{BURST}")
    # 20 emails wanted within about a second: ten times what the connection allows.
    run_ids = [await api.start(agent) for agent in senders for _ in range(4)]

    async def parked_enough() -> bool:
        return await parked_on_rate(db, run_ids) >= 5

    await eventually(parked_enough, timeout=20, message="no run parked on the limit")
    # No executor waits on the limit: parked runs gave their slots up, so another
    # provider's run starts and ends at once while the emails still trickle out.
    began = time.monotonic()
    echo_id = await api.start("echoer", "still moving")
    (echo,) = await api.wait_terminal([echo_id], within=10)
    assert echo.status == run_pb2.RUN_STATUS_COMPLETED and time.monotonic() - began < 5
    assert await parked_on_rate(db, run_ids) > 0, "the mail runs were already done"

    runs = await api.wait_terminal(run_ids, within=60)
    assert {r.status for r in runs} == {run_pb2.RUN_STATUS_COMPLETED}, [r.error for r in runs]
    sends = provider_log(sandbox_providers.url, run_ids, "/mail/send")
    assert sorted(r["idempotency_key"].split(":")[0] for r in sends) == sorted(run_ids)
    assert_within_rate([r["time"] for r in sends], RATE, BURST)
    parks = await rate_parks(api, run_ids)
    assert sum(len(p) for p in parks.values()) >= 10
    model_log = sandbox_requests(sandbox_model.url)
    for run_id in run_ids:
        steps = await api.steps(run_id)
        assert_log_well_formed(steps)
        assert_no_reask(run_id, steps, model_log)


async def test_a_429_with_retry_after_resumes_the_run_no_earlier(
    stack, executor_factory, sandbox_providers
):
    cp, api = stack
    await api.publish("poster", "poster", ["chat_post"])
    run_id = await api.start("poster")  # queued: no executor yet
    set_fault(
        sandbox_providers.url,
        provider="chat",
        mode="rate_limit",
        retry_after=3,
        count=1,
        key_prefix=f"{run_id}:",
    )
    try:
        executor_factory(cp, AGENTRUN_RATE_COOLDOWN_SECONDS="5")
        (run,) = await api.wait_terminal([run_id], within=30)
    finally:
        clear_faults(sandbox_providers.url)
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    refused, sent = provider_log(sandbox_providers.url, [run_id], "/chat/messages")
    assert (refused["status"], sent["status"]) == (429, 200)
    assert refused["idempotency_key"] == sent["idempotency_key"]
    assert sent["time"] - refused["time"] >= 3.0
    ((park,),) = (await rate_parks(api, [run_id])).values()
    assert park["cause"] == "429" and park["wake_after_seconds"] >= 3.0
    # chat_post has no key and no lookup: only the park's record that the 429
    # applied nothing lets it go out again rather than wait for a person.
    steps = await api.steps(run_id)
    (result,) = [s for s in steps if s.kind == "tool_result"]
    assert result.payload["status"] == "ok"
    assert_log_well_formed(steps)


async def test_redis_killed_mid_load_no_call_bypasses_the_limit(
    stack, db, executor_factory, embedded_redis, sandbox_providers
):
    cp, api = stack
    for agent in ("a", "b", "c"):
        await api.publish(f"sender-{agent}", "demo", ["crm_lookup", "send_email"])
    executors = executor_factory(
        cp,
        count=2,
        AGENTRUN_RATE_LIMITS=f"mail={RATE:g}/s:1",
        AGENTRUN_REDIS_BACKOFF_CAP_SECONDS="1",
    )
    run_ids = [await api.start(f"sender-{a}") for a in ("a", "b", "c") for _ in range(4)]
    await eventually(
        lambda: len(provider_log(sandbox_providers.url, run_ids, "/mail/send")) >= 3,
        timeout=20,
        message="no email went out",
    )

    embedded_redis.kill()
    killed = time.time()
    await eventually(lambda: _parked_unavailable(api, run_ids), timeout=20, message="nobody parked")
    await asyncio.sleep(1.0)  # the outage: a second more of runs finding no Redis
    restarting = time.time()
    embedded_redis.restart()

    runs = await api.wait_terminal(run_ids, within=60)
    assert {r.status for r in runs} == {run_pb2.RUN_STATUS_COMPLETED}, [r.error for r in runs]
    # A request that had its token just before the kill may land just after it; none later.
    during = [
        r
        for r in provider_log(sandbox_providers.url, run_ids)
        if killed + JITTER < r["time"] < restarting
    ]
    assert during == [], "requests went out while the limiter was down"
    sends = provider_log(sandbox_providers.url, run_ids, "/mail/send")
    assert len(sends) == len(run_ids)
    logs = "".join(e.log_tail(400) for e in executors)
    assert "rate limiter unavailable" in logs and "limiter_unavailable=" in logs


async def _parked_unavailable(api: Api, run_ids: list[str]) -> bool:
    parks = await rate_parks(api, run_ids)
    return any(p.get("cause") == "unavailable" for ps in parks.values() for p in ps)
