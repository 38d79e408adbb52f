"""Flow control on webhook triggers against real Postgres: a debounced burst starts one run
carrying its last event (on a controlled clock), and batches hold every event exactly once
through a kill -9 of the control plane mid-flush. Event counts: AGENTRUN_FLOW_EVENTS."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta

import asyncpg
import grpc
import httpx
import pytest

from agentrun.v1 import trigger_pb2 as pb
from control_plane.api.triggers import _webhook
from control_plane.ground.config import RunDefaults
from control_plane.store import triggers as store
from control_plane.triggers import admission, deliveries
from control_plane.triggers.scheduler import Scheduler
from tests import factories
from tests.harness import auth
from tests.harness.cli import agentrun_async
from tests.harness.triggers import TriggerApi, post, signed
from tests.harness.waiting import eventually

WS = "ws"
T = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
EVENTS = int(os.environ.get("AGENTRUN_FLOW_EVENTS", "1000"))


@pytest.fixture
async def pool(db_url):
    made = await asyncpg.create_pool(db_url, min_size=1, max_size=4)
    await factories.agent_version(made, WS, "agent")
    yield made
    await made.close()


async def webhook(pool, trigger_id: str, source: pb.WebhookSource) -> deliveries.Settings:
    scheme, config = _webhook(source)
    new = store.NewTrigger(
        workspace_id=WS,
        trigger_id=trigger_id,
        agent_id="agent",
        kind="webhook",
        scheme=scheme,
        config=config,
        filters=[],
    )
    row = await store.create_trigger(pool, new, None)
    assert row is not None
    return deliveries.Settings.of(row)


async def deliver(pool, settings, n: int, now: datetime | None = None) -> None:
    for i in range(n):
        doc = {"id": f"evt-{i}", "customer": {"id": "c1"}, "n": i}
        event = deliveries.webhook_event(settings, {}, doc)
        outcome = await admission.admit(pool, event, RunDefaults(), now)
        assert outcome.status == "pending" and outcome.run_id is None


async def runs_of(db, trigger_id: str) -> list[asyncpg.Record]:
    return await db.fetch(
        "SELECT r.run_id, s.payload FROM runs r JOIN steps s USING (workspace_id, run_id)"
        " WHERE r.started_by = $1 AND s.seq = 0 ORDER BY r.created_at",
        f"trigger:{trigger_id}",
    )


def source(**flow: object) -> pb.WebhookSource:
    return pb.WebhookSource(scheme=pb.SIGNATURE_SCHEME_HMAC_SHA256, dedupe_field="id", **flow)


async def test_a_debounced_burst_starts_one_run_carrying_its_last_event(pool, db):
    deb = pb.TriggerDebounce(key="customer.id", quiet_seconds=5)
    settings = await webhook(pool, "deb", source(debounce=deb))
    await deliver(pool, settings, EVENTS, now=T)
    sched = Scheduler(pool, RunDefaults(), lambda: None)
    assert await sched.tick(T + timedelta(seconds=4)) == 0  # not yet quiet for 5 s
    assert await runs_of(db, "deb") == []
    assert await sched.tick(T + timedelta(seconds=5)) == 1
    assert await sched.tick(T + timedelta(seconds=60)) == 0  # nothing left to flush
    [run] = await runs_of(db, "deb")
    payload = json.loads(run["payload"])
    assert payload["trigger"]["dedupe_key"] == f"evt-{EVENTS - 1}"
    assert payload["trigger"]["debounce"] == {"key": "c1", "events": EVENTS}
    assert f'"n": {EVENTS - 1}' in payload["text"]
    statuses = await db.fetch(
        "SELECT status, run_id, count(*) FROM trigger_events WHERE trigger_id = 'deb' GROUP BY 1, 2"
    )
    assert [(r["status"], r["run_id"], r["count"]) for r in statuses] == [
        ("accepted", run["run_id"], EVENTS)
    ]


async def test_a_debounced_run_is_keyed_by_the_last_event_it_carries(pool, db):
    """A trigger's concurrency_key (issue 45, item 3) reads the event a flushed run carries."""
    deb = pb.TriggerDebounce(key="customer.id", quiet_seconds=5)
    settings = await webhook(pool, "kdeb", source(debounce=deb))
    rule = {"key": "input.customer.id", "path": ["customer", "id"], "limit": 1}
    settings = deliveries.Settings.of(
        await db.fetchrow(
            "UPDATE triggers SET config = config || jsonb_build_object('concurrency_key',"
            " $1::jsonb) WHERE trigger_id = 'kdeb' RETURNING *",
            json.dumps(rule),
        )
    )
    await deliver(pool, settings, 3, now=T)
    assert await Scheduler(pool, RunDefaults(), lambda: None).tick(T + timedelta(seconds=5)) == 1
    row = await db.fetchrow(
        "SELECT concurrency_key, key_rule FROM runs WHERE started_by = 'trigger:kdeb'"
    )
    assert row["concurrency_key"] == "c1"
    assert json.loads(row["key_rule"]) == {**rule, "value": "c1"}


async def test_a_partial_batch_runs_once_its_wait_is_over(pool, db):
    settings = await webhook(
        pool, "tb", source(batch=pb.TriggerBatch(max_events=100, max_seconds=10))
    )
    await deliver(pool, settings, 150, now=T)
    sched = Scheduler(pool, RunDefaults(), lambda: None)
    assert await sched.tick(T) == 1  # the full hundred at once
    assert await sched.tick(T + timedelta(seconds=9)) == 0  # fifty wait for more
    assert await sched.tick(T + timedelta(seconds=10)) == 1
    found = await runs_of(db, "tb")
    sizes = [json.loads(r["payload"])["trigger"]["batch"]["events"] for r in found]
    assert sizes == [100, 50]
    assert await db.fetchval("SELECT count(*) FROM trigger_flow_groups") == 0


async def test_batches_hold_every_event_once_through_a_kill_mid_flush(
    pool, db, db_url, control_plane
):
    size = max(2, EVENTS // 10)
    cp = control_plane(db_url, AGENTRUN_FAULTS="control_plane.trigger_flow.before_commit=kill@4")
    bat = pb.TriggerBatch(max_events=size, max_seconds=3600)
    settings = await webhook(pool, "bat", source(batch=bat))
    await deliver(pool, settings, EVENTS)
    cp.process.wait(timeout=30)  # killed in its fourth flush, before that commit
    assert 0 < len(await runs_of(db, "bat")) < EVENTS // size
    cp.restart(AGENTRUN_FAULTS="")

    async def all_flushed():
        found = await runs_of(db, "bat")
        assert len(found) == EVENTS // size
        return found

    found = await eventually(all_flushed, timeout=30)
    held = [k for r in found for k in json.loads(r["payload"])["trigger"]["batch"]["dedupe_keys"]]
    assert sorted(held) == sorted(f"evt-{i}" for i in range(EVENTS))  # each exactly once
    assert all(
        len(json.loads(r["payload"])["trigger"]["batch"]["dedupe_keys"]) == size for r in found
    )
    pending = await db.fetchval("SELECT count(*) FROM trigger_events WHERE status = 'pending'")
    assert pending == 0


@pytest.fixture
async def api(server, db_url):
    client = TriggerApi(f"127.0.0.1:{server.port}", WS, await auth.workspace_key(db_url, WS))
    await client.publish("triage")
    yield client
    await client.close()


async def test_debounce_through_the_http_ingress_per_header_key(api, server, db):
    deb = pb.TriggerDebounce(key="header:X-Customer", quiet_seconds=1)
    secret = await api.webhook("hook", "triage", "hmac_sha256", debounce=deb)
    got = await api.triggers.GetTrigger(pb.GetTriggerRequest(workspace_id=WS, trigger_id="hook"))
    assert got.trigger.webhook.debounce == deb
    url = f"http://127.0.0.1:{server.http_port}"
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        for n in range(10):
            body, headers = signed("hmac_sha256", secret, {"n": n}, f"d-{n}")
            headers["X-Customer"] = f"c{n % 2}"
            for _ in range(2):  # a redelivery is the same pending event
                reply = await post(http, WS, "hook", body, headers)
                assert reply.status_code == 202
                assert reply.json()["status"] == "pending" and "run_id" not in reply.json()

    async def flushed():
        found = await runs_of(db, "hook")
        assert len(found) == 2
        return found

    found = await eventually(flushed, timeout=15)
    last = sorted(json.loads(r["payload"])["trigger"]["dedupe_key"] for r in found)
    assert last == ["d-8", "d-9"]  # each key's run carries its last event
    events = await api.events("hook")
    assert len(events) == 10
    assert {e.status for e in events} == {pb.TRIGGER_EVENT_STATUS_ACCEPTED}


@pytest.mark.parametrize(
    ("flow", "field"),
    [
        ({"debounce": pb.TriggerDebounce(key="", quiet_seconds=5)}, "webhook.debounce.key"),
        (
            {"debounce": pb.TriggerDebounce(key="a", quiet_seconds=-1)},
            "webhook.debounce.quiet_seconds",
        ),
        ({"batch": pb.TriggerBatch(max_events=5000, max_seconds=5)}, "webhook.batch.max_events"),
        ({"batch": pb.TriggerBatch(max_events=5, max_seconds=0)}, "webhook.batch.max_seconds"),
        (
            {
                "batch": pb.TriggerBatch(max_events=5, max_seconds=5),
                "debounce": pb.TriggerDebounce(key="a", quiet_seconds=5),
            },
            "webhook.batch",
        ),
    ],
)
async def test_bad_flow_values_are_refused_naming_the_field(api, db, flow, field):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await api.webhook("bad", "triage", "hmac_sha256", **flow)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(f"{field}:"), info.value.details()
    assert await db.fetchval("SELECT count(*) FROM triggers") == 0


async def cli(server, key: str, *argv: str) -> tuple[int, str]:
    """Run `agentrun …` against the in-process server; its exit code and all it printed."""
    done = await agentrun_async(f"127.0.0.1:{server.port}", key, *argv, workspace=WS)
    return done.returncode, done.stdout + done.stderr


async def test_the_cli_creates_batched_and_debounced_triggers(api, server, db):
    create = ("triggers", "create", "--agent", "triage", "--webhook", "github")
    code, out = await cli(
        server, api.key, *create, "b", "--batch-size", "3", "--batch-seconds", "60"
    )
    assert code == 0 and "flow      batch of 3 or 60s" in out, out
    code, out = await cli(
        server,
        api.key,
        *create,
        "d",
        "--debounce-key",
        "header:X-Customer",
        "--debounce-seconds",
        "5",
    )
    assert code == 0 and "flow      debounce on header:X-Customer, quiet 5s" in out, out
    code, out = await cli(
        server, api.key, *create, "x", "--batch-size", "1", "--batch-seconds", "9"
    )
    assert code != 0 and "webhook.batch.max_events" in out, out
    assert await db.fetchval("SELECT count(*) FROM triggers WHERE trigger_id = 'x'") == 0
