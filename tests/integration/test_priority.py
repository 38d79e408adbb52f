"""Run priority (issue 17 item 3): a run's priority moves it ahead within its workspace's
fair share, never past another workspace's turn; the claim stays an index probe however many
runs are parked; bad priorities are refused by name and write nothing."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys

import asyncpg
import grpc
import httpx
import pytest

from agentrun.v1 import run_pb2, run_pb2_grpc, session_pb2
from agentrun.v1 import trigger_pb2 as pb
from control_plane.store import lease, runs, workspaces
from tests import factories
from tests.harness.auth import bearer
from tests.harness.databases import use_claim_walk
from tests.harness.triggers import SCHEME, TriggerApi, post, seconds, signed
from tests.harness.waiting import eventually

WS = "ws"


@pytest.fixture(params=["default", "levels"], ids=["as migrated", "walk over levels"])
async def pool(db_url, request):
    """The claim as the migrations made it for this server (a skip scan on Postgres 18 and
    later), and with the walk over priority levels that servers before 18 keep."""
    p = await asyncpg.create_pool(db_url, min_size=1, max_size=4)
    async with p.acquire() as conn:
        await use_claim_walk(conn, request.param)
    yield p
    await p.close()


async def admit(pool, priorities: list[int], workspace_id: str = WS) -> list[runs.Run]:
    """One run per priority, admitted in this order (one agent version for all)."""
    version = await factories.agent_version(pool, workspace_id, "agent")
    out = []
    for i, priority in enumerate(priorities):
        adm = runs.Admission(
            workspace_id=workspace_id,
            agent_id="agent",
            agent_version=version,
            input=f"input {i}",
            request_id=None,
            max_steps=50,
            max_tokens=100_000,
            max_tool_calls=100,
            deadline_seconds=3600,
            priority=priority,
        )
        row = await runs.insert_run(pool, adm)
        assert row is not None and row.priority == priority
        out.append(row)
    return out


async def claim_one(pool) -> runs.Run:
    (row,) = await lease.claim_due(pool, ["ex"], 30)
    return row


async def test_a_later_higher_priority_run_is_claimed_before_earlier_ones(pool):
    await workspaces.set_plan(pool, WS, "enterprise", 100)
    first, second, high, low, third = await admit(pool, [0, 0, 10, -5, 0])
    parked = (await admit(pool, [50]))[0]
    await pool.execute(
        "UPDATE runs SET status = 'waiting', wait_reason = 'sleep', "
        "wake_at = now() + interval '1 hour' WHERE run_id = $1",
        parked.run_id,
    )
    order = [(await claim_one(pool)).run_id for _ in range(5)]
    # Highest first, then oldest first within a priority; a parked run stays parked
    # whatever its priority.
    assert order == [high.run_id, first.run_id, second.run_id, third.run_id, low.run_id]
    assert await lease.claim_due(pool, ["ex"], 30) == []


async def test_priority_never_gives_a_workspace_a_turn_out_of_order(pool):
    for ws in ("hot", "cold"):
        await workspaces.set_plan(pool, ws, "enterprise", 100)
    await admit(pool, [0, 0, 0], "cold")
    await admit(pool, [100, 100, 100], "hot")  # later, and every run at the top priority
    # One run per claim: the workspaces alternate, the high one never gets two in a row.
    order = [(await claim_one(pool)).workspace_id for _ in range(4)]
    assert order in (["cold", "hot"] * 2, ["hot", "cold"] * 2), order
    # A batch goes round robin too: one run of each, however high the priorities.
    batch = await lease.claim_due(pool, ["ex", "ex"], 30)
    assert sorted(r.workspace_id for r in batch) == ["cold", "hot"]


async def test_queue_position_counts_higher_priority_runs_ahead(pool):
    await workspaces.set_plan(pool, WS, "enterprise", 1)  # the first claim fills the cap
    oldest, second, high = await admit(pool, [0, 0, 5])
    assert (await claim_one(pool)).run_id == high.run_id
    ahead = [(await lease.queue_position(pool, WS, r.run_id)).runs_ahead for r in (oldest, second)]
    assert ahead == [0, 1]
    urgent = (await admit(pool, [7]))[0]  # admitted last, ahead of both
    assert (await lease.queue_position(pool, WS, urgent.run_id)).runs_ahead == 0
    after = [await lease.queue_position(pool, WS, r.run_id) for r in (oldest, second)]
    assert [p.runs_ahead for p in after] == [1, 2] and after[0].workspace_full


PARK = """
INSERT INTO runs (workspace_id, run_id, agent_id, agent_version, status, wait_reason, wake_at,
                  input, max_steps, max_tokens, max_tool_calls, deadline_seconds, repeat_limit,
                  priority)
SELECT $1, gen_random_uuid(), 'agent', $2::int, 'waiting', 'sleep',
       CASE WHEN g % 2 = 0 THEN NULL ELSE now() + interval '1 hour' + g * interval '1 s' END,
       'parked', 50, 1000, 30, 3600, 3, 100
FROM generate_series(1, $3::int) AS g
UNION ALL
SELECT $1, gen_random_uuid(), 'agent', $2::int, 'queued', NULL, now() - g * interval '1 s',
       'backlog', 50, 1000, 30, 3600, 3, 0
FROM generate_series(1, $3::int) AS g
"""


async def claim_buffers(pool) -> int:
    """Buffers one single-run claim touches, all four of its steps (agentrun_claim(), as
    lease.claim_due calls it: its SET clauses plan them generically), under EXPLAIN
    ANALYZE, rolled back. The function scan's buffers count every page its statements
    read: a PL/pgSQL function's inner reads go to the node that called it."""
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        try:
            plan = await conn.fetchval(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM agentrun_claim("
                "ARRAY['ex'], 30, NULL, NULL, NULL, NULL, NULL, 0, false)"
            )
        finally:
            await tx.rollback()
    root = json.loads(plan)[0]["Plan"]
    assert root["Actual Rows"] == 1, "a due run was claimed"
    return root["Shared Hit Blocks"] + root["Shared Read Blocks"]


async def test_the_claim_reads_neither_higher_priority_parked_runs_nor_the_backlog(pool):
    """The worst layout for a priority order: runs parked (on a later time or none) at a
    higher priority than a backlog of due runs. A single-run claim reads the same few pages
    with 1,000 of each or PRIORITY_RUNS (default 20,000): each priority level is one index
    probe that stops at its first run not yet due, and the walk stops once it has a run.
    Sorting the due backlog, or walking the parked runs' index entries, would each read over
    a hundred pages at 20,000."""
    await workspaces.set_plan(pool, WS, "enterprise", 1000)
    version = await factories.agent_version(pool, WS, "agent")
    touched = {}
    for n in (1_000, int(os.environ.get("PRIORITY_RUNS", "20000"))):
        await pool.execute("DELETE FROM runs")
        await pool.execute(PARK, WS, version, n)
        await pool.execute(
            "UPDATE workspace_turns SET next_wake_at = now() WHERE workspace_id = $1", WS
        )
        await pool.execute("VACUUM ANALYZE runs")
        touched[n] = min([await claim_buffers(pool) for _ in range(3)])
    shallow, deep = touched.values()
    print(f"claim buffers: {touched}")
    assert deep <= shallow + 20, touched  # an index level deeper costs a page per probe


async def refused(call) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    return err.value.details() or ""


@pytest.fixture
async def api(server, db_url):
    api = await TriggerApi.connect(f"127.0.0.1:{server.port}", db_url, WS)
    await api.publish("digest")
    yield api
    await api.close()


async def test_priority_through_the_api_and_bad_ones_write_nothing(api, server, db, tmp_path):
    stub = run_pb2_grpc.RunServiceStub(api.channel)
    start = run_pb2.StartRunRequest(agent_id="digest", input="x", priority=101)
    assert "priority" in await refused(stub.StartRun(start))
    hourly = pb.ScheduleSource(interval=seconds(3600), input="digest")
    assert "priority" in await refused(api.create("bad", "digest", schedule=hourly, priority=-101))
    session = await api.sessions.CreateSession(session_pb2.CreateSessionRequest(agent_id="digest"))
    send = session_pb2.SendMessageRequest(
        session_id=session.session.session_id, text="hi", priority=500
    )
    assert "priority" in await refused(api.sessions.SendMessage(send))
    assert await db.fetchval("SELECT count(*) FROM runs") == 0
    assert await db.fetchval("SELECT count(*) FROM triggers") == 0

    start.priority = 7
    assert (await stub.StartRun(start)).run.priority == 7
    created, _ = await api.create("hourly", "digest", schedule=hourly, priority=9)
    assert created.priority == 9
    now = await api.triggers.TriggerScheduleNow(pb.TriggerScheduleNowRequest(trigger_id="hourly"))
    fired = await stub.GetRun(run_pb2.GetRunRequest(run_id=now.event.run_id))
    assert fired.run.priority == 9
    # An update without a priority keeps it; a bad one is refused and changes nothing.
    update = pb.UpdateScheduleRequest(trigger_id="hourly", schedule=hourly)
    assert (await api.triggers.UpdateSchedule(update)).trigger.priority == 9
    update.priority = 200
    assert "priority" in await refused(api.triggers.UpdateSchedule(update))
    get = pb.GetTriggerRequest(trigger_id="hourly")
    assert (await api.triggers.GetTrigger(get)).trigger.priority == 9

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
            *args,
        ]
        done = await asyncio.to_thread(
            subprocess.run, argv, capture_output=True, text=True, timeout=60, env=env
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    out = await cli("--json", "runs", "start", "digest", "--input", "hi", "--priority", "-3")
    started = json.loads(out)["run"]
    assert started["priority"] == -3
    # A fork without --priority keeps the source's; with it, takes its own, shown by runs show.
    out = await cli("--json", "runs", "fork", started["run_id"], "--from-seq", "0")
    assert json.loads(out)["priority"] == -3
    out = await cli(
        "--json", "runs", "fork", started["run_id"], "--from-seq", "0", "--priority", "20"
    )
    assert "priority  20" in await cli("runs", "show", json.loads(out)["run_id"])
    out = await cli(
        "triggers", "create", "urgent", "--agent", "digest", "--every", "3600", "--priority", "50"
    )
    assert "priority  50" in out


async def test_a_session_message_over_http_takes_a_priority_as_send_message_does(api, server, db):
    session = await api.sessions.CreateSession(session_pb2.CreateSessionRequest(agent_id="digest"))
    path = f"/v1/workspaces/{WS}/sessions/{session.session.session_id}/messages"
    base = f"http://127.0.0.1:{server.http_port}"
    async with httpx.AsyncClient(base_url=base, timeout=10, headers=bearer(api.key)) as http:
        bad = [
            await http.post(path, json={"text": "hi", "priority": p})
            for p in (101, -101, "5", 1.5, True)
        ]
        assert [(b.status_code, b.json()["error"].split(":")[0]) for b in bad] == [
            (400, "priority")
        ] * 5
        assert await db.fetchval("SELECT count(*) FROM runs") == 0
        sent = await http.post(path, json={"text": "hi", "priority": 6, "strategy": "enqueue"})
        assert sent.status_code == 202, sent.text
        assert sent.json()["priority"] == 6
    stub = run_pb2_grpc.RunServiceStub(api.channel)
    got = await stub.GetRun(run_pb2.GetRunRequest(run_id=sent.json()["run_id"]))
    assert got.run.priority == 6


async def test_a_fork_keeps_its_sources_priority_unless_it_names_one(api, server, db):
    stub = run_pb2_grpc.RunServiceStub(api.channel)
    start = run_pb2.StartRunRequest(agent_id="digest", input="x", priority=8)
    source = (await stub.StartRun(start)).run
    fork = run_pb2.ForkRunRequest(run_id=source.run_id, from_seq=0)
    forked = (await stub.ForkRun(fork)).run
    assert forked.priority == 8
    # The console's run page shows it.
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as http:
        form = await http.get("/console/signin")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert csrf is not None, form.text
        signin = {"csrf": csrf[1], "key": api.key, "next": "/console/runs"}
        assert (await http.post("/console/signin/key", data=signin)).status_code == 303
        page = await http.get(f"/console/runs/{forked.run_id}")
        assert '<dd id="run-priority">8</dd>' in page.text
    fork.priority = 0  # named, even as the default
    assert (await stub.ForkRun(fork)).run.priority == 0
    fork.priority = 300
    assert "priority" in await refused(stub.ForkRun(fork))
    assert await db.fetchval("SELECT count(*) FROM runs") == 3


async def test_debounced_and_batched_runs_take_their_triggers_priority(api, server, db):
    flows = {
        "deb": {"debounce": pb.TriggerDebounce(key="k", quiet_seconds=1)},
        "bat": {"batch": pb.TriggerBatch(max_events=2, max_seconds=1)},
    }
    base = f"http://127.0.0.1:{server.http_port}"
    async with httpx.AsyncClient(base_url=base, timeout=10) as http:
        for trigger_id, flow in flows.items():
            hook = pb.WebhookSource(scheme=SCHEME["hmac_sha256"], **flow)
            _, secret = await api.create(trigger_id, "digest", webhook=hook, priority=-20)
            for n in range(2):
                body, headers = signed(
                    "hmac_sha256", secret, {"k": "a", "n": n}, f"{trigger_id}-{n}"
                )
                assert (await post(http, WS, trigger_id, body, headers)).status_code == 202

    async def started() -> list[tuple[str, int]]:
        rows = await db.fetch("SELECT started_by, priority FROM runs ORDER BY started_by")
        assert len(rows) == 2
        return [tuple(r) for r in rows]

    assert await eventually(started, timeout=15) == [("trigger:bat", -20), ("trigger:deb", -20)]
