"""Flow control on webhook triggers against real Postgres: a debounced burst starts one run
carrying its last event (on a controlled clock), and batches hold every event exactly once
through a kill -9 of the control plane mid-flush. Event counts: AGENTRUN_FLOW_EVENTS."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta

import asyncpg
import grpc
import pytest

from agentrun.v1 import trigger_pb2 as pb
from control_plane.api.triggers import _webhook
from control_plane.config import RunDefaults
from control_plane.errors import InvalidArgument
from control_plane.scheduler import Scheduler
from control_plane.store import triggers as store
from control_plane.triggers import admission, deliveries
from tests import factories
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
    new = store.NewTrigger(workspace_id=WS, trigger_id=trigger_id, agent_id="agent",
                           kind="webhook", scheme=scheme, config=config, filters=[])  # fmt: skip
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
        " WHERE r.started_by = $1 AND s.seq = 0 ORDER BY r.created_at", f"trigger:{trigger_id}"
    )  # fmt: skip


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
        "SELECT status, run_id, count(*) FROM trigger_events WHERE trigger_id = 'deb'"
        " GROUP BY 1, 2"
    )  # fmt: skip
    assert [(r["status"], r["run_id"], r["count"]) for r in statuses] == [
        ("accepted", run["run_id"], EVENTS)
    ]


def test_bad_flow_values_name_the_field():
    with pytest.raises(InvalidArgument) as err:
        _webhook(source(batch=pb.TriggerBatch(max_events=1, max_seconds=10)))
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "webhook.batch.max_events" in str(err.value)
    with pytest.raises(InvalidArgument, match="webhook.debounce.quiet_seconds"):
        _webhook(source(debounce=pb.TriggerDebounce(key="a.b", quiet_seconds=0)))


async def test_batches_hold_every_event_once_through_a_kill_mid_flush(pool, db, db_url,
                                                                      control_plane):  # fmt: skip
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
    assert all(len(json.loads(r["payload"])["trigger"]["batch"]["dedupe_keys"]) == size
               for r in found)  # fmt: skip
    pending = await db.fetchval("SELECT count(*) FROM trigger_events WHERE status = 'pending'")
    assert pending == 0
