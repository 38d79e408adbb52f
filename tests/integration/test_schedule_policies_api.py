"""The schedule RPCs and CLI commands against a real control plane: update in place, pause
with a note, backfill, trigger now, delete; bad input names its field and writes nothing."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from agentrun.v1 import trigger_pb2 as pb
from tests.harness.triggers import TriggerApi, seconds

WS = "ws"
HOUR = 3600
SKIP = pb.SCHEDULE_OVERLAP_POLICY_SKIP
ALLOW_ALL = pb.SCHEDULE_OVERLAP_POLICY_ALLOW_ALL


def at(moment: datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(moment)
    return ts


@pytest.fixture
async def api(server, db_url):
    api = await TriggerApi.connect(f"127.0.0.1:{server.port}", db_url, WS)
    await api.publish("digest")
    yield api
    await api.close()


async def refused(call, code=grpc.StatusCode.INVALID_ARGUMENT) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    assert err.value.code() == code, err.value.details()
    return err.value.details() or ""


async def test_schedule_rpcs_update_pause_backfill_trigger_now_and_delete(api, db):
    hourly = pb.ScheduleSource(
        interval=seconds(HOUR), input="digest", overlap_policy=SKIP, catchup_window=seconds(1800)
    )
    created, _ = await api.create("hourly", "digest", schedule=hourly)
    assert created.schedule.overlap_policy == SKIP
    assert created.schedule.catchup_window.seconds == 1800
    t = api.triggers

    # Bad input names its field and writes nothing.
    short = pb.ScheduleSource(
        interval=seconds(HOUR), jitter=seconds(60), catchup_window=seconds(30)
    )
    assert "schedule.catchup_window" in await refused(api.create("x", "digest", schedule=short))
    odd = pb.ScheduleSource(interval=seconds(HOUR), overlap_policy=99)  # type: ignore[arg-type]
    assert "schedule.overlap_policy" in await refused(
        t.UpdateSchedule(pb.UpdateScheduleRequest(trigger_id="hourly", schedule=odd))
    )
    now = datetime.now(UTC)
    start = (now - timedelta(hours=10)).replace(minute=0, second=0, microsecond=0)
    backwards = pb.BackfillScheduleRequest(
        trigger_id="hourly", start_time=at(now), end_time=at(start)
    )
    assert "end_time" in await refused(t.BackfillSchedule(backwards))
    assert "start_time" in await refused(
        t.BackfillSchedule(pb.BackfillScheduleRequest(trigger_id="hourly", end_time=at(now)))
    )
    too_many = pb.BackfillScheduleRequest(
        trigger_id="hourly", start_time=at(now - timedelta(days=60)), end_time=at(now)
    )
    assert "end_time" in await refused(t.BackfillSchedule(too_many))
    assert await db.fetchval("SELECT count(*) FROM trigger_events") == 0
    assert await db.fetchval("SELECT count(*) FROM triggers") == 1

    # A backfill of ten hourly slots, twice: ten runs. The schedule's skip policy applies
    # unless the request overrides it (here every slot should start its run).
    fill = pb.BackfillScheduleRequest(
        trigger_id="hourly",
        start_time=at(start),
        end_time=at(start + timedelta(hours=10)),
        overlap_policy=ALLOW_ALL,
    )
    first, second = [await t.BackfillSchedule(fill) for _ in range(2)]
    assert (first.slots, first.started, first.already_fired) == (10, 10, 0)
    assert (second.slots, second.started, second.already_fired) == (10, 0, 10)
    assert await db.fetchval("SELECT count(*) FROM runs") == 10

    # Trigger now: under skip, the backfilled runs still queued make it a recorded skip;
    # with ALLOW_ALL it starts a run, and its retry (same request id) finds that run.
    skipped = await t.TriggerScheduleNow(pb.TriggerScheduleNowRequest(trigger_id="hourly"))
    assert skipped.created and skipped.event.status == pb.TRIGGER_EVENT_STATUS_FILTERED
    assert "overlap policy skip" in skipped.event.reason
    now_req = pb.TriggerScheduleNowRequest(
        trigger_id="hourly", request_id="deploy-42", overlap_policy=ALLOW_ALL
    )
    started, again = [await t.TriggerScheduleNow(now_req) for _ in range(2)]
    assert started.created and started.event.run_id
    assert not again.created and again.event.run_id == started.event.run_id
    assert await db.fetchval("SELECT count(*) FROM runs") == 11

    # Update in place: same trigger and events, the new spec, its next slot.
    daily = pb.ScheduleSource(cron="0 9 * * *", time_zone="Europe/Paris", input="daily digest")
    updated = (
        await t.UpdateSchedule(pb.UpdateScheduleRequest(trigger_id="hourly", schedule=daily))
    ).trigger
    assert updated.schedule.cron == "0 9 * * *" and updated.schedule.time_zone == "Europe/Paris"
    assert updated.schedule.overlap_policy == ALLOW_ALL  # the spec is replaced whole
    assert updated.create_time == created.create_time
    assert updated.schedule.next_slot_time.ToDatetime(tzinfo=UTC).hour in (7, 8)  # 09:00 Paris
    assert len(await api.events("hourly")) == 12

    # Pause and unpause with a note (audited).
    paused = (
        await t.SetTriggerEnabled(
            pb.SetTriggerEnabledRequest(trigger_id="hourly", enabled=False, note="quarter close")
        )
    ).trigger
    assert (paused.enabled, paused.note) == (False, "quarter close")
    notes = await db.fetch(
        "SELECT action, detail->>'note' AS note FROM audit_log WHERE object_id = 'hourly'"
        " AND action LIKE 'trigger.%abled' ORDER BY audit_id"
    )
    assert [(n["action"], n["note"]) for n in notes] == [("trigger.disabled", "quarter close")]

    # Delete: the trigger and its events go, its runs stay; a webhook is no schedule.
    await api.webhook("hook", "digest", "github")
    assert "not a schedule" in await refused(
        t.UpdateSchedule(pb.UpdateScheduleRequest(trigger_id="hook", schedule=daily)),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    await t.DeleteTrigger(pb.DeleteTriggerRequest(trigger_id="hourly"))
    await refused(
        t.GetTrigger(pb.GetTriggerRequest(trigger_id="hourly")), grpc.StatusCode.NOT_FOUND
    )
    await refused(
        t.DeleteTrigger(pb.DeleteTriggerRequest(trigger_id="hourly")), grpc.StatusCode.NOT_FOUND
    )
    assert await db.fetchval("SELECT count(*) FROM trigger_events") == 0
    assert await db.fetchval("SELECT count(*) FROM runs") == 11


async def test_the_cli_pauses_updates_backfills_triggers_now_and_deletes(api, server, tmp_path, db):
    await api.create("nightly", "digest", schedule=pb.ScheduleSource(interval=seconds(HOUR)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRUN_")}
    env.update(
        AGENTRUN_API_KEY=api.key or "",
        AGENTRUN_WORKSPACE=WS,
        AGENTRUN_CONFIG=str(tmp_path / "config.toml"),
    )

    async def cli(*args: str) -> str:
        argv = [
            sys.executable,
            "-m",
            "agentrun_cli",
            "--address",
            f"127.0.0.1:{server.port}",
            "triggers",
            *args,
        ]
        done = await asyncio.to_thread(
            subprocess.run, argv, capture_output=True, text=True, timeout=60, env=env
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    out = await cli("pause", "nightly", "--note", "maintenance")
    assert "disabled" in out and "note      maintenance" in out
    out = await cli("update", "nightly", "--every", "7200", "--overlap", "buffer_one")
    assert "every 7200s" in out and "overlap   buffer_one" in out and "disabled" in out
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=6)
    start, end = hour.isoformat(), (hour + timedelta(hours=6)).isoformat()
    out = await cli("backfill", "nightly", "--start", start, "--end", end, "--overlap", "allow_all")
    assert "started" in out and "0 already fired" in out
    out = await cli("trigger-now", "nightly", "--request-id", "k1")
    assert "buffered" in out  # buffer_one, and the backfilled runs are still queued
    out = await cli("unpause", "nightly", "--note", "done")
    assert "enabled" in out and "note      done" in out
    assert "deleted trigger nightly" in await cli("delete", "nightly")
    assert await db.fetchval("SELECT count(*) FROM triggers") == 0
