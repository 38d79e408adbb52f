"""Retention: a workspace's finished runs past its period are deleted with every row that
names them, a bounded batch per statement; unfinished runs, runs within the period and
workspaces that keep everything (0, the default) are untouched.

The store's clock is injected: runs finish at T (years from the database's clock), and the
retention round runs at a given `now`, so no test waits for days to pass.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from control_plane.deploys.canary import CANARY_KEEP, CANARY_WORKSPACE
from control_plane.runs.retention import Retention
from control_plane.store import lease, runs
from control_plane.store import retention as store
from tests import factories

T = datetime(2031, 6, 1, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)


async def _queued(pool, ws: str = "ws", at: datetime = T, agent: str = "agent") -> uuid.UUID:
    version = await factories.agent_version(pool, ws, agent)
    adm = runs.Admission(
        workspace_id=ws,
        agent_id=agent,
        agent_version=version,
        input="go",
        request_id=None,
        max_steps=50,
        max_tokens=1000,
        max_tool_calls=10,
        deadline_seconds=3600,
    )
    run = await runs.insert_run(pool, adm, now=at)
    assert run is not None
    return run.run_id


async def _finished(pool, ws: str = "ws", at: datetime = T) -> uuid.UUID:
    run_id = await _queued(pool, ws, at)
    assert await runs.cancel_run(pool, ws, run_id, "done", now=at) is not None
    return run_id


async def _keep(pool, ws: str, days: int) -> None:
    assert await store.set_days(pool, ws, days) is not None


async def _with_everything(pool, ws: str, run_id: uuid.UUID) -> None:
    """A trigger event, a payload and its chunk, an approval and its token, an audit row."""
    await pool.execute(
        "INSERT INTO triggers (workspace_id, trigger_id, agent_id, kind, scheme)"
        " VALUES ($1, 'hook', 'agent', 'webhook', 'hmac_sha256') ON CONFLICT DO NOTHING",
        ws,
    )
    await pool.execute(
        "INSERT INTO trigger_events (workspace_id, event_id, trigger_id, dedupe_key, status,"
        " run_id, payload) VALUES ($1, $2, 'hook', $3, 'accepted', $4, '{}')",
        ws,
        uuid.uuid4(),
        str(run_id),
        run_id,
    )
    sha = uuid.uuid4().hex * 2
    await pool.execute(
        "INSERT INTO payload_chunks (workspace_id, sha256, \"offset\", data) VALUES ($1, $2, 0, 'x')",
        ws,
        sha,
    )
    await pool.execute(
        "INSERT INTO payloads (workspace_id, sha256, size, media_type, run_id)"
        " VALUES ($1, $2, 1, 'text/plain', $3)",
        ws,
        sha,
        run_id,
    )
    approval = uuid.uuid4()
    await pool.execute(
        "INSERT INTO approvals (workspace_id, approval_id, run_id, decision_seq, call_id, tool,"
        " arguments, arguments_sha256, approvers, expire_at, expiry_seconds, on_expiry)"
        " VALUES ($1, $2, $3, 1, 'c1', 'pay', '{}', $4, '{pat}', $5, 60, 'reject')",
        ws,
        approval,
        run_id,
        "0" * 64,
        T,
    )
    await pool.execute(
        "INSERT INTO approval_tokens (workspace_id, token_sha256, approval_id, approver,"
        " expires_at) VALUES ($1, $2, $3, 'pat', $4)",
        ws,
        uuid.uuid4().bytes,
        approval,
        T,
    )
    await pool.execute(
        "INSERT INTO audit_log (workspace_id, actor, action, object_kind, object_id, request_id)"
        " VALUES ($1, 'key:ops', 'run.cancelled', 'run', $2, 'r1')",
        ws,
        str(run_id),
    )


async def _rows(pool, ws: str, run_id: uuid.UUID) -> dict[str, int]:
    """How many rows of each kind name the run (approval tokens and chunks through theirs)."""
    counts = {}
    for table in ("runs", "steps", "trigger_events", "payloads", "approvals"):
        counts[table] = await pool.fetchval(
            f"SELECT count(*) FROM {table} WHERE workspace_id = $1 AND run_id = $2", ws, run_id
        )
    counts["audit_log"] = await pool.fetchval(
        "SELECT count(*) FROM audit_log WHERE workspace_id = $1 AND object_kind = 'run'"
        " AND object_id = $2",
        ws,
        str(run_id),
    )
    counts["payload_chunks"] = await pool.fetchval(
        "SELECT count(*) FROM payload_chunks WHERE workspace_id = $1", ws
    )
    counts["approval_tokens"] = await pool.fetchval(
        "SELECT count(*) FROM approval_tokens WHERE workspace_id = $1", ws
    )
    return counts


async def test_old_finished_runs_go_with_their_rows_and_nothing_else_does(pool):
    old = await _finished(pool, at=T)
    await _with_everything(pool, "ws", old)
    before = await _rows(pool, "ws", old)
    assert before["steps"] >= 2 and all(before.values()), before
    recent = await _finished(pool, at=T + 20 * DAY)
    unfinished = await _queued(pool, at=T)
    (held,) = await lease.claim_due(pool, ["ex"], 30, now=T + DAY)  # old, still running
    assert held.run_id == unfinished
    forever = await _finished(pool, ws="other", at=T)
    await _keep(pool, "ws", 30)

    assert await Retention(pool).tick(now=T + 31 * DAY) == 1

    assert set((await _rows(pool, "ws", old)).values()) == {0}
    for run_id in (recent, unfinished):
        assert (await runs.get_run(pool, "ws", run_id)) is not None
        assert await pool.fetchval("SELECT count(*) FROM steps WHERE run_id = $1", run_id) >= 1
    assert (await runs.get_run(pool, "other", forever)) is not None, "0 keeps everything"
    # The recent one goes once its own period is over; the unfinished one never does.
    assert await Retention(pool).tick(now=T + 51 * DAY) == 1
    assert (await runs.get_run(pool, "ws", recent)) is None
    assert (await runs.get_run(pool, "ws", unfinished)).status == "running"


async def test_each_statement_deletes_at_most_a_batch(pool, caplog):
    ids = [await _finished(pool, at=T) for _ in range(7)]
    await _keep(pool, "ws", 1)
    ((_, cutoff),) = await store.due_workspaces(pool, T + 2 * DAY)
    gone = [(await store.delete_batch(pool, "ws", cutoff, 3)).runs for _ in range(2)]
    assert gone == [3, 3]
    ids.append(await _finished(pool, at=T))
    caplog.set_level(logging.INFO, logger="control_plane.runs.retention")
    assert await Retention(pool, batch=3).tick(now=T + 2 * DAY) == 2
    batches = [r.args[0] for r in caplog.records if r.name == "control_plane.runs.retention"]
    assert batches == [2]
    assert await pool.fetchval("SELECT count(*) FROM runs WHERE workspace_id = 'ws'") == 0


async def test_a_statement_deletes_runs_while_their_steps_stay_under_the_budget(pool):
    """The oldest runs first, as many as keep the steps deleted within `steps`, yet always
    one, however many steps it has; the runs left over are the newer ones."""
    ids = [await _finished(pool, at=T + i * timedelta(minutes=1)) for i in range(4)]
    counts = [await pool.fetchval("SELECT step_count FROM runs WHERE run_id = $1", i) for i in ids]
    assert min(counts) >= 2, counts
    await _keep(pool, "ws", 1)
    ((_, cutoff),) = await store.due_workspaces(pool, T + 2 * DAY)
    # Runs 0 and 1 fit; run 2 would start past the budget.
    gone = await store.delete_batch(pool, "ws", cutoff, 500, steps=counts[0] + counts[1])
    assert (gone.runs, gone.steps) == (2, counts[0] + counts[1])
    left = {r["run_id"] for r in await pool.fetch("SELECT run_id FROM runs")}
    assert left == {ids[2], ids[3]}
    gone = await store.delete_batch(pool, "ws", cutoff, 500, steps=1)
    assert (gone.runs, gone.steps) == (1, counts[2])
    assert {r["run_id"] for r in await pool.fetch("SELECT run_id FROM runs")} == {ids[3]}


async def test_the_loop_rests_after_each_statement_for_its_duty_cycle(pool, caplog):
    """With duty d, the rest after a statement that took t is t (1 - d) / d, so the deleter
    is at work at most d of the round's time."""
    for i in range(3):
        await _finished(pool, at=T + i * timedelta(minutes=1))
    await _keep(pool, "ws", 1)
    caplog.set_level(logging.INFO, logger="control_plane.runs.retention")
    began = asyncio.get_running_loop().time()
    assert await Retention(pool, batch=1, duty=0.25).tick(now=T + 2 * DAY) == 3
    took = asyncio.get_running_loop().time() - began
    logged = [r.args for r in caplog.records if r.name == "control_plane.runs.retention"]
    assert [a[0] for a in logged] == [1, 1, 1]
    for _, _, _, statement, rest in logged:
        assert rest == pytest.approx(3 * statement)
    assert took >= sum(a[3] + a[4] for a in logged) * 0.99
    with pytest.raises(ValueError, match="duty"):
        Retention(pool, duty=0)


async def test_the_loop_deletes_no_more_step_rows_a_second_than_its_rate(pool, caplog):
    """With a rate of r step rows a second, a statement that deleted n of them and took t
    is followed by a rest of at least n / r - t (the duty cycle's when that is longer), so
    the round deletes no faster than r whatever its statements take."""
    for i in range(3):
        await _finished(pool, at=T + i * timedelta(minutes=1))
    await _keep(pool, "ws", 1)
    caplog.set_level(logging.INFO, logger="control_plane.runs.retention")
    began = asyncio.get_running_loop().time()
    # duty 1: no rest for the duty cycle, so every rest is the rate's.
    deleter = Retention(pool, batch=1, duty=1, steps_per_second=20)
    assert await deleter.tick(now=T + 2 * DAY) == 3
    took = asyncio.get_running_loop().time() - began
    logged = [r.args for r in caplog.records if r.name == "control_plane.runs.retention"]
    assert [a[0] for a in logged] == [1, 1, 1]
    steps = [a[1] for a in logged]
    assert min(steps) >= 2, steps
    for _, n, _, statement, rest in logged:
        assert rest == pytest.approx(n / 20 - statement)
    assert took >= sum(steps) / 20 * 0.99
    # The duty cycle's rest wins when it is the longer one.
    await _finished(pool, at=T)
    caplog.clear()
    deleter = Retention(pool, batch=1, duty=0.25, steps_per_second=1e9)
    assert await deleter.tick(now=T + 2 * DAY) == 1
    logged = [r.args for r in caplog.records if r.name == "control_plane.runs.retention"]
    ((_, _, _, statement, rest),) = logged
    assert rest == pytest.approx(3 * statement)
    with pytest.raises(ValueError, match="steps_per_second"):
        Retention(pool, steps_per_second=0)


async def test_the_loop_deletes_a_backlog_in_bounded_statements(pool, caplog):
    for _ in range(8):
        await _finished(pool, at=T)
    await _keep(pool, "ws", 1)
    caplog.set_level(logging.INFO, logger="control_plane.runs.retention")
    assert await Retention(pool, batch=3).tick(now=T + 2 * DAY) == 8
    batches = [r.args[0] for r in caplog.records if r.name == "control_plane.runs.retention"]
    assert batches == [3, 3, 2]


async def test_a_run_another_transaction_holds_is_skipped_not_waited_on(pool):
    locked, free = await _finished(pool, at=T), await _finished(pool, at=T)
    await _keep(pool, "ws", 1)
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "SELECT 1 FROM runs WHERE workspace_id = 'ws' AND run_id = $1 FOR UPDATE", locked
        )
        deleted = await asyncio.wait_for(Retention(pool).tick(now=T + 2 * DAY), 10)
        assert deleted == 1
    assert (await runs.get_run(pool, "ws", free)) is None
    assert (await runs.get_run(pool, "ws", locked)) is not None
    assert await Retention(pool).tick(now=T + 2 * DAY) == 1


async def test_a_finished_parent_waits_for_its_unfinished_child(pool):
    parent = await _finished(pool, at=T)
    child = await _queued(pool, at=T)
    await pool.execute(
        "UPDATE runs SET parent_run_id = $1, parent_seq = 1 WHERE run_id = $2", parent, child
    )
    await _keep(pool, "ws", 1)
    assert await Retention(pool).tick(now=T + 2 * DAY) == 0
    await runs.cancel_run(pool, "ws", child, "done", now=T)
    assert await Retention(pool).tick(now=T + 2 * DAY) == 2


async def test_a_payload_a_kept_run_references_is_handed_over_not_deleted(pool):
    old, kept = await _finished(pool, at=T), await _finished(pool, at=T + 20 * DAY)
    await _with_everything(pool, "ws", old)
    sha = await pool.fetchval("SELECT sha256 FROM payloads WHERE run_id = $1", old)
    # The kept run uploaded the same bytes second (or is a fork): its step references them.
    ref = json.dumps({"output": "…", "payload": {"sha256": sha, "size": 1}})
    await pool.execute(
        "INSERT INTO steps (workspace_id, run_id, seq, kind, epoch, payload)"
        " VALUES ('ws', $1, 50, 'tool_result', 1, $2::jsonb)",
        kept,
        ref,
    )
    await _keep(pool, "ws", 30)
    assert await Retention(pool).tick(now=T + 31 * DAY) == 1
    assert await pool.fetchval("SELECT run_id FROM payloads WHERE sha256 = $1", sha) == kept
    assert await pool.fetchval("SELECT count(*) FROM payload_chunks WHERE sha256 = $1", sha) == 1
    assert await Retention(pool).tick(now=T + 51 * DAY) == 1
    assert await pool.fetchval("SELECT count(*) FROM payloads WHERE sha256 = $1", sha) == 0
    assert await pool.fetchval("SELECT count(*) FROM payload_chunks WHERE sha256 = $1", sha) == 0


async def test_finished_canary_runs_go_after_an_hour_whatever_the_period(pool):
    """The canary's internal workspace keeps nothing (retention 0, the default) yet its
    finished runs go an hour after they finished; its unfinished and recent ones stay."""
    old = await _finished(pool, CANARY_WORKSPACE, at=T)
    recent = await _finished(pool, CANARY_WORKSPACE, at=T + timedelta(minutes=50))
    going = await _queued(pool, CANARY_WORKSPACE, at=T)
    customer = await _finished(pool, "ws", at=T)  # keeps everything
    assert await Retention(pool).tick(now=T + CANARY_KEEP + timedelta(minutes=1)) == 1
    left = await pool.fetch("SELECT run_id FROM runs")
    assert {r["run_id"] for r in left} == {recent, going, customer}
    assert (await _rows(pool, CANARY_WORKSPACE, old))["steps"] == 0
