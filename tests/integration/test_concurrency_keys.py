"""Keyed concurrency (issue 45, item 3): an agent version's `concurrency_key` caps how many
of its runs with one key (a path over the run's input) hold a slot at once; the others wait
(wait_reason "concurrency_key", GetRun naming the key), and a holder's end by any path
passes its slot to the key's next waiter. An optional rate spaces a key's grants.

The issue's figure is 50 customers x 20 runs at a limit of 2; here one big customer's 12
runs beside 6 small customers' 2 each (28 runs, a few seconds on one executor) show the
same two things: never more than 2 of a key at once (from the runs' claim and finish
times and a sampler), and the small customers starting promptly while the big backlog
waits. The first tests need no executor: nothing claims, so the slots stay as admitted."""

from __future__ import annotations

import asyncio
import json
import uuid

import asyncpg
import grpc
import httpx
import pytest

from agentrun.v1 import agent_pb2, run_pb2
from control_plane.store import runs
from tests import factories
from tests.harness import auth
from tests.harness.agentrun_api import Api


@pytest.fixture
async def stack(db_url, control_plane, sandbox_model, sandbox_providers):
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url)
    db = await asyncpg.connect(db_url)
    yield cp, api, db
    await db.close()
    await api.close()


def keyed(limit: int, rate: agent_pb2.KeyRate | None = None) -> agent_pb2.AgentSpec:
    return agent_pb2.AgentSpec(
        model="fan_kid",
        instructions="test agent",
        tools=["echo"],
        concurrency_key=agent_pb2.ConcurrencyKey(key="input.customer_id", limit=limit, rate=rate),
    )


async def publish(api: Api, spec: agent_pb2.AgentSpec, agent_id: str = "job") -> None:
    await api.agents.CreateAgent(
        agent_pb2.CreateAgentRequest(workspace_id=api.ws, agent_id=agent_id)
    )
    await api.agents.PublishAgentVersion(
        agent_pb2.PublishAgentVersionRequest(workspace_id=api.ws, agent_id=agent_id, spec=spec)
    )


async def start(
    api: Api, customer: str | None, n: int = 0, request_id: str = "", agent_id: str = "job"
) -> run_pb2.Run:
    body = {"n": n} if customer is None else {"customer_id": customer, "n": n}
    resp = await api.runs.StartRun(
        run_pb2.StartRunRequest(
            workspace_id=api.ws, agent_id=agent_id, input=json.dumps(body), request_id=request_id
        )
    )
    return resp.run


async def cancel(api: Api, run_id: str) -> None:
    await api.runs.CancelRun(run_pb2.CancelRunRequest(workspace_id=api.ws, run_id=run_id))


async def key_row(db: asyncpg.Connection, key: str) -> tuple[int, int] | None:
    row = await db.fetchrow(
        "SELECT held, slot_limit FROM concurrency_keys WHERE workspace_id = 'ws'"
        " AND agent_id = 'job' AND key = $1",
        key,
    )
    return (row["held"], row["slot_limit"]) if row else None


async def test_a_full_key_parks_its_runs_getrun_names_the_key_and_a_cancel_passes_the_slot(
    stack,
):
    cp, api, db = stack
    await publish(api, keyed(limit=1))
    first = await start(api, "acme", 0)
    second = await start(api, "acme", 1)
    third = await start(api, "acme", 2)
    other = await start(api, "globex", 0)  # another key: not held up
    nokey = await start(api, None)  # no customer_id: the key ""

    got = {r.run_id: await api.get(r.run_id) for r in (first, second, third, other, nokey)}
    assert got[first.run_id].status == run_pb2.RUN_STATUS_QUEUED
    assert got[first.run_id].concurrency_key == "acme"
    assert got[other.run_id].status == run_pb2.RUN_STATUS_QUEUED
    assert (got[nokey.run_id].status, got[nokey.run_id].concurrency_key) == (
        run_pb2.RUN_STATUS_QUEUED,
        "",
    )
    for i, waiter in enumerate((second, third)):
        run = got[waiter.run_id]
        assert (run.status, run.wait_reason, run.concurrency_key) == (
            run_pb2.RUN_STATUS_WAITING,
            "concurrency_key",
            "acme",
        )
        assert not run.HasField("wake_time")  # the claim never takes it
        assert run.queue.cause == run_pb2.QUEUE_WAIT_CAUSE_CONCURRENCY_KEY
        assert run.queue.runs_ahead == i
    assert await key_row(db, "acme") == (1, 1)
    # StartRun's own answer says it waits, and the HTTP run view names the key too (absent
    # for a run of a version without one).
    assert (third.status, third.wait_reason) == (run_pb2.RUN_STATUS_WAITING, "concurrency_key")
    key = await auth.workspace_key(api.db_url, "ws", role="reader")
    async with httpx.AsyncClient(headers=auth.bearer(key), timeout=30) as http:
        seen = (await http.get(f"{cp.http_url}/v1/workspaces/ws/runs/{second.run_id}")).json()
    assert (seen["status"], seen["wait_reason"]) == ("waiting", "concurrency_key")
    assert seen["concurrency_key"] == "acme"
    assert seen["queue"]["cause"] == "concurrency_key"

    # Cancelling a waiter frees nothing; cancelling the holder hands its slot to the oldest
    # waiter, due at once, in the cancel's transaction.
    await cancel(api, third.run_id)
    assert await key_row(db, "acme") == (1, 1)
    await cancel(api, first.run_id)
    moved = await api.get(second.run_id)
    assert (moved.status, moved.wait_reason, moved.concurrency_key) == (
        run_pb2.RUN_STATUS_QUEUED,
        "",
        "acme",
    )
    assert moved.HasField("wake_time") and moved.queue.cause != (
        run_pb2.QUEUE_WAIT_CAUSE_CONCURRENCY_KEY
    )
    assert await key_row(db, "acme") == (1, 1)
    # The last holder's end frees the key: its row goes.
    await cancel(api, second.run_id)
    assert await key_row(db, "acme") is None


async def test_a_resent_start_takes_no_second_slot_any_end_releases_and_a_rate_spaces(stack):
    _, api, db = stack
    await publish(api, keyed(limit=2))
    a = await start(api, "acme", 0, request_id="r-1")
    again = await start(api, "acme", 0, request_id="r-1")  # its reply lost: sent again
    assert again.run_id == a.run_id
    assert await key_row(db, "acme") == (1, 2)
    b = await start(api, "acme", 1)
    c = await start(api, "acme", 2)
    assert (await api.get(c.run_id)).wait_reason == "concurrency_key"
    # A holder failed by a statement outside the API (as the max-age sweep does) passes its
    # slot on too: the trigger catches every end.
    await db.execute(
        "UPDATE runs SET status = 'failed', error = 'max age', finished_at = now(),"
        " wake_at = NULL WHERE workspace_id = 'ws' AND run_id = $1",
        uuid.UUID(b.run_id),
    )
    assert (await api.get(c.run_id)).status == run_pb2.RUN_STATUS_QUEUED
    assert await key_row(db, "acme") == (2, 2)

    # A rate spaces a key's grants.
    paced = keyed(limit=10, rate=agent_pb2.KeyRate(per_seconds=2, runs=4))
    await publish(api, paced, "paced")
    started = [await start(api, "acme", i, agent_id="paced") for i in range(4)]
    other = await start(api, "globex", 0, agent_id="paced")
    wakes = [
        await db.fetchval(
            "SELECT wake_at FROM runs WHERE workspace_id = 'ws' AND run_id = $1",
            uuid.UUID(r.run_id),
        )
        for r in started
    ]
    gaps = [(b - a).total_seconds() for a, b in zip(wakes, wakes[1:], strict=False)]
    # 4 per 2 s: each grant 0.5 s after the one before (the admissions themselves are
    # quicker than that), each run holding its slot until then.
    assert all(0.49 <= g <= 0.51 for g in gaps), gaps
    assert {(await api.get(r.run_id)).status for r in started} == {run_pb2.RUN_STATUS_QUEUED}
    assert (
        await db.fetchval(
            "SELECT held FROM concurrency_keys WHERE agent_id = 'paced' AND key = 'acme'"
        )
        == 4
    )
    # Another key has its own rate.
    assert (await api.get(other.run_id)).wake_time.ToDatetime() < wakes[1].replace(tzinfo=None)


async def test_admissions_and_ends_at_once_never_exceed_the_limit_nor_strand_a_waiter(pool, db_url):
    """Many admissions and holder ends of one key at once, each on its own connection: the
    slots held always equal the key's unfinished holders, never above the limit, and no run
    waits while a slot is free (no wake lost between a park and an end)."""
    spec = {
        **factories.DEFAULT_SPEC,
        "concurrency_key": {"key": "input.c", "path": ["c"], "limit": 3},
    }
    version = await factories.agent_version(pool, "ws", "job", spec)
    conns = [await asyncpg.connect(db_url) for _ in range(8)]

    def admission(i: int) -> runs.Admission:
        text = json.dumps({"c": "k", "i": i})
        return runs.Admission("ws", "job", version, text, None, 5, 1000, 5, 60)

    async def check() -> None:
        row = await pool.fetchrow(
            "SELECT count(*) FILTER (WHERE key_slot) AS holders,"
            " count(*) FILTER (WHERE wait_reason = 'concurrency_key') AS waiters"
            " FROM runs WHERE workspace_id = 'ws' AND agent_id = 'job'"
            " AND status NOT IN ('completed', 'failed', 'cancelled')"
        )
        held = await pool.fetchval(
            "SELECT coalesce(sum(held), 0) FROM concurrency_keys WHERE workspace_id = 'ws'"
        )
        assert held == row["holders"] <= 3, (held, dict(row))
        assert row["waiters"] == 0 or row["holders"] == 3, dict(row)

    try:
        for wave in range(4):
            await asyncio.gather(
                *(runs.insert_run(c, admission(wave * 8 + i)) for i, c in enumerate(conns))
            )
            await check()
            holders = await pool.fetch(
                "SELECT run_id FROM runs WHERE workspace_id = 'ws' AND key_slot"
                " AND status NOT IN ('completed', 'failed', 'cancelled')"
            )
            waiters = await pool.fetch(
                "SELECT run_id FROM runs WHERE workspace_id = 'ws'"
                " AND wait_reason = 'concurrency_key' LIMIT 3"
            )
            ends = [r["run_id"] for r in holders[:2]] + [r["run_id"] for r in waiters[:2]]
            await asyncio.gather(
                *(runs.cancel_run(c, "ws", r, "ended") for c, r in zip(conns, ends, strict=False))
            )
            await check()
    finally:
        for c in conns:
            await c.close()


BAD_KEYS = [
    (agent_pb2.ConcurrencyKey(limit=2), "spec.concurrency_key.key"),
    (agent_pb2.ConcurrencyKey(key="customer_id", limit=2), "spec.concurrency_key.key"),
    (agent_pb2.ConcurrencyKey(key="input.a b", limit=2), "spec.concurrency_key.key"),
    (agent_pb2.ConcurrencyKey(key="input.customer_id"), "spec.concurrency_key.limit"),
    (
        agent_pb2.ConcurrencyKey(key="input.customer_id", limit=100_001),
        "spec.concurrency_key.limit",
    ),
    (
        agent_pb2.ConcurrencyKey(key="input.customer_id", limit=2, rate=agent_pb2.KeyRate(runs=1)),
        "spec.concurrency_key.rate.per_seconds",
    ),
    (
        agent_pb2.ConcurrencyKey(
            key="input.customer_id", limit=2, rate=agent_pb2.KeyRate(per_seconds=1)
        ),
        "spec.concurrency_key.rate.runs",
    ),
]


async def test_a_bad_key_is_refused_naming_the_field(stack):
    _, api, _ = stack
    await api.agents.CreateAgent(agent_pb2.CreateAgentRequest(workspace_id=api.ws, agent_id="job"))
    for key, field in BAD_KEYS:
        spec = agent_pb2.AgentSpec(model="fan_kid", instructions="x", concurrency_key=key)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await api.agents.PublishAgentVersion(
                agent_pb2.PublishAgentVersionRequest(workspace_id=api.ws, agent_id="job", spec=spec)
            )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, key
        assert field in (err.value.details() or ""), (key, err.value.details())
    # A good one is kept as declared.
    await publish(api, keyed(limit=2, rate=agent_pb2.KeyRate(per_seconds=60, runs=30)), "ok")
    got = await api.agents.GetAgentVersion(
        agent_pb2.GetAgentVersionRequest(workspace_id=api.ws, agent_id="ok", version=1)
    )
    assert (
        got.version.spec.concurrency_key
        == keyed(limit=2, rate=agent_pb2.KeyRate(per_seconds=60, runs=30)).concurrency_key
    )


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most intervals open at one moment (one ending as another starts: not both)."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    most = now = 0
    for _, d in edges:
        now += d
        most = max(most, now)
    return most


async def test_two_per_customer_at_most_while_small_customers_start_promptly(
    stack, executor_factory
):
    cp, api, db = stack
    await publish(api, keyed(limit=2))
    executor_factory(cp, AGENTRUN_CAPACITY=8)
    # The executor connected first (one run through), so a time to start is the queue's.
    await api.wait_terminal([(await start(api, "warm-up")).run_id], within=60)
    big = [await start(api, "big", i) for i in range(12)]
    small = [await start(api, f"small-{c}", i) for c in range(6) for i in range(2)]
    seen: list[int] = []

    async def sample() -> None:
        while True:
            seen.append(
                await db.fetchval(
                    "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM runs"
                    " WHERE workspace_id = 'ws' AND status = 'running'"
                    " GROUP BY concurrency_key) k"
                )
            )
            await asyncio.sleep(0.03)

    sampler = asyncio.ensure_future(sample())
    try:
        done = await api.wait_terminal([r.run_id for r in big + small], within=120)
    finally:
        sampler.cancel()
    assert {r.status for r in done} == {run_pb2.RUN_STATUS_COMPLETED}, [r.error for r in done]

    rows = await db.fetch(
        "SELECT concurrency_key, created_at, started_at, finished_at FROM runs"
        " WHERE workspace_id = 'ws' AND agent_id = 'job' AND concurrency_key <> 'warm-up'"
    )
    by_key: dict[str, list[asyncpg.Record]] = {}
    for r in rows:
        by_key.setdefault(r["concurrency_key"], []).append(r)
    # From the run log: each run's hold (its claim to its finish) overlaps at most one other
    # of its key's. A slot passes on in the finishing transaction and its waiter becomes
    # due only once that commits, so a key's holds cannot seem to overlap more than that.
    for key, held in by_key.items():
        spans = [(r["started_at"].timestamp(), r["finished_at"].timestamp()) for r in held]
        assert most_at_once(spans) <= 2, (key, sorted(spans))
    assert max(seen) <= 2, seen
    big_spans = [(r["started_at"].timestamp(), r["finished_at"].timestamp()) for r in by_key["big"]]
    assert most_at_once(big_spans) == 2  # the limit was used, not just respected

    def to_start(r: asyncpg.Record) -> float:
        return (r["started_at"] - r["created_at"]).total_seconds()

    small_waits = sorted(to_start(r) for k, v in by_key.items() if k != "big" for r in v)
    big_waits = sorted(to_start(r) for r in by_key["big"])
    # The big customer's backlog waits its turn by twos (its last run starts after five
    # rounds), while every small customer's run starts well before it, admitted later though
    # they were: the big backlog does not hold them up.
    assert small_waits[-1] < big_waits[-1] / 2, (small_waits, big_waits)
