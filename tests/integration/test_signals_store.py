"""Signals at the store, against real Postgres: a signal that arrives before the park, while
the park's commit is in flight, or after it becomes the wait_for_signal call's result exactly
once, and the mailbox hands out each signal once, oldest first."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid

import pytest

from control_plane.ground.errors import AlreadyExists, FailedPrecondition, NotFound
from control_plane.runs import signals
from control_plane.store import lease, runs, steps
from tests import factories
from tests.harness.commits import signal_commit
from tests.harness.waiting import eventually


def started(seq: int, name: str, call_id: str = "c1") -> steps.NewStep:
    payload = {
        "call_id": call_id,
        "tool": "wait_for_signal",
        "class": "internal",
        "arguments": {"name": name},
    }
    return steps.NewStep(seq, "tool_started", seq - 1, json.dumps(payload))


def decision(seq: int, call_id: str = "c1") -> steps.NewStep:
    call = {"id": call_id, "name": "wait_for_signal", "arguments": "{}"}
    return steps.NewStep(seq, "model_decision", None, json.dumps({"tool_calls": [call]}))


def park_request(run: runs.Run, epoch: int, seq: int, name: str) -> steps.CommitRequest:
    """The executor's wait_for_signal commit: decision, started call and park at once."""
    park = steps.NewStep(seq + 2, "park", None, json.dumps({"wait_reason": "signal"}))
    return steps.CommitRequest(
        run.workspace_id,
        run.run_id,
        epoch,
        [decision(seq), started(seq + 1, name, f"c{seq}"), park],
        steps.Transition(status="waiting", wait_reason="signal"),
    )


def outgoing(run: runs.Run, event_id: str, payload: object, name: str = "go") -> signals.Outgoing:
    return signals.Outgoing(run.workspace_id, run.run_id, name, event_id, payload, "key:test")


async def claimed(pool) -> tuple[runs.Run, int]:
    (run,) = await factories.queued_runs(pool, 1)
    (held,) = await lease.claim_due(pool, ["ex-a"], 30)
    return run, held.lease_epoch


async def results(pool, run: runs.Run) -> list[dict]:
    log = await steps.list_steps(pool, run.workspace_id, run.run_id, 0, 100)
    return [
        {"seq": s.seq, "ref": s.ref_seq, **json.loads(s.payload)}
        for s in log
        if s.kind == "tool_result"
    ]


async def blocked_on_a_lock(pool) -> bool:
    waiting = await pool.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND datname = current_database()"
    )
    return waiting > 0


async def test_a_signal_sent_while_the_park_commit_is_in_flight_is_delivered_once(pool):
    run, epoch = await claimed(pool)
    woken: list[str] = []
    async with pool.acquire() as conn, conn.transaction():
        # The park commit, inside a transaction this test holds open: the run row is locked.
        await signal_commit(conn, park_request(run, epoch, 1, "go"), 30, lambda: None)
        sending = asyncio.create_task(
            signals.send(pool, outgoing(run, "e1", {"ok": 1}), lambda: woken.append("s"))
        )
        await eventually(
            lambda: blocked_on_a_lock(pool),
            timeout=10,
            message="SignalRun never waited for the park's row lock",
        )
    sent = await sending
    assert sent.created and sent.signal.consumed_seq == 2 and woken == ["s"]
    (result,) = await results(pool, run)
    assert result["ref"] == 2 and result["seq"] == sent.signal.result_seq == 4
    assert result["output"]["payload"] == {"ok": 1} and result["output"]["event_id"] == "e1"
    row = await runs.get_run(pool, run.workspace_id, run.run_id)
    assert row is not None and row.status == "waiting" and row.wake_at is not None


async def test_a_signal_that_holds_the_lock_first_is_delivered_by_the_park_commit(pool):
    run, epoch = await claimed(pool)
    woken: list[str] = []
    async with pool.acquire() as conn, conn.transaction():
        # SignalRun inside a transaction this test holds open: stored, the run is running.
        sent = await signals.send(conn, outgoing(run, "e1", [1, 2]), lambda: woken.append("s"))
        assert sent.signal.consumed_seq is None
        parking = asyncio.create_task(
            signal_commit(pool, park_request(run, epoch, 1, "go"), 30, lambda: woken.append("p"))
        )
        await eventually(
            lambda: blocked_on_a_lock(pool),
            timeout=10,
            message="the park commit never waited for SignalRun's row lock",
        )
    committed = await parking
    assert committed.status == "waiting" and woken == ["p"]
    (result,) = await results(pool, run)
    assert (result["ref"], result["output"]["payload"]) == (2, [1, 2])
    (stored,) = await signals.signals_of(pool, run.workspace_id, run.run_id)
    assert (stored.consumed_seq, stored.result_seq) == (2, result["seq"])


async def test_the_mailbox_answers_each_call_once_oldest_first_by_name(pool):
    run, epoch = await claimed(pool)
    for event_id, name in (("a", "go"), ("b", "other"), ("c", "go")):
        await signals.send(pool, outgoing(run, event_id, event_id, name), lambda: None)
    await signal_commit(pool, park_request(run, epoch, 1, "go"), 30, lambda: None)
    (first,) = await results(pool, run)
    assert first["output"]["event_id"] == "a"
    # Resent park commit (its reply was lost): a duplicate, nothing delivered again.
    again = await signal_commit(pool, park_request(run, epoch, 1, "go"), 30, lambda: None)
    assert again.duplicate and len(await results(pool, run)) == 1
    # The next claim, the next wait: "c" (the "other" one waits for its own name).
    (held,) = await lease.claim_due(pool, ["ex-a"], 30)
    await signal_commit(pool, park_request(run, held.lease_epoch, 5, "go"), 30, lambda: None)
    assert [r["output"]["event_id"] for r in await results(pool, run)] == ["a", "c"]
    by_id = {s.event_id: s for s in await signals.signals_of(pool, run.workspace_id, run.run_id)}
    assert by_id["b"].consumed_seq is None
    assert (by_id["a"].consumed_seq, by_id["c"].consumed_seq) == (2, 6)


async def test_event_ids_make_signals_idempotent_and_an_ended_run_refuses_new_ones(pool):
    run, epoch = await claimed(pool)
    await signal_commit(pool, park_request(run, epoch, 1, "go"), 30, lambda: None)
    first = await signals.send(pool, outgoing(run, "e1", {"a": 1, "b": 2}), lambda: None)
    # The same event again (keys in another order: the same JSON value): the first, unchanged.
    again = await signals.send(pool, outgoing(run, "e1", {"b": 2, "a": 1}), lambda: None)
    assert (again.created, again.signal) == (False, first.signal)
    with pytest.raises(AlreadyExists, match="e1"):
        await signals.send(pool, outgoing(run, "e1", {"a": 2}), lambda: None)
    with pytest.raises(AlreadyExists):
        await signals.send(pool, outgoing(run, "e1", {"a": 1, "b": 2}, name="stop"), lambda: None)
    assert len(await signals.signals_of(pool, run.workspace_id, run.run_id)) == 1
    assert len(await results(pool, run)) == 1
    await runs.cancel_run(pool, run.workspace_id, run.run_id, "done")
    with pytest.raises(FailedPrecondition, match="ended"):
        await signals.send(pool, outgoing(run, "e2", None), lambda: None)
    # A redelivery of the first event after the end is still the first's answer.
    late = await signals.send(pool, outgoing(run, "e1", {"a": 1, "b": 2}), lambda: None)
    assert late.created is False and late.signal.result_seq == first.signal.result_seq
    missing = dataclasses.replace(run, run_id=uuid.uuid4())
    with pytest.raises(NotFound):
        await signals.send(pool, outgoing(missing, "e1", None), lambda: None)
