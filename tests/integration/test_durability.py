"""Crash, pause and restart tests with real processes: no re-ask, no repeated write, no lost run.

Each test drives real executors (`python -m executor`), a real control plane
(`python -m control_plane`), real Postgres and the sandbox servers. Crashes are
SIGKILLs at named fault points, so each one lands exactly where it is meant to.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from agentrun.v1 import run_pb2
from tests.harness.agentrun_api import (
    Api,
    AutoApprover,
    clear_faults,
    sandbox_effects,
    sandbox_requests,
    set_fault,
)
from tests.harness.idp import member_signed_in
from tests.harness.invariants import (
    assert_effects_at_most_once,
    assert_log_well_formed,
    assert_no_reask,
    assert_writes_at_most_once,
)
from tests.harness.waiting import eventually

WRITER_TOOLS = ["crm_lookup", "send_email", "echo", "sleep"]


@pytest.fixture
async def stack(db_url, control_plane, sandbox_model, sandbox_providers, sandbox_idp):
    cp = control_plane(db_url, AGENTRUN_OIDC_ISSUER=sandbox_idp.url)
    api = await Api.connect(cp.address, db_url)
    await api.publish("writer", "writer", WRITER_TOOLS)
    md = await member_signed_in(db_url, sandbox_idp.url)
    async with AutoApprover(api, metadata=md):  # money-moving tools wait for a person's approval
        yield cp, api
    await api.close()


async def check_run(api, run_id, sandbox_model, sandbox_providers):
    """The invariants every run must satisfy; returns its steps."""
    steps = await api.steps(run_id)
    assert_log_well_formed(steps)
    assert_no_reask(run_id, steps, sandbox_requests(sandbox_model.url))
    assert_writes_at_most_once(
        [
            r
            for r in sandbox_requests(sandbox_providers.url)
            if (r["idempotency_key"] or "").startswith(run_id)
        ],
        "/mail/send",
    )
    return steps


# (fault point, which hit) -> what the resumed run must show. The writer
# scenario calls crm_lookup, then send_email (class lookup), then echo; hit 2
# of a tool point is the send_email write.
CRASH_POINTS = [
    ("executor.model.after_response", 1),
    ("executor.decision.after_commit", 2),
    ("executor.tool.after_started_commit", 2),
    ("executor.tool.after_response", 2),
    ("executor.tool.after_result_commit", 2),
]


@pytest.mark.parametrize(("point", "hit"), CRASH_POINTS)
async def test_kill_at_each_point_of_a_step_resumes_on_another_executor(
    stack, executor_factory, sandbox_model, sandbox_providers, point, hit
):
    cp, api = stack
    run_id = await api.start("writer")
    (doomed,) = executor_factory(cp, AGENTRUN_FAULTS=f"{point}=kill@{hit}")
    await eventually(lambda: not doomed.alive, timeout=30, message=f"{point} never fired")
    assert doomed.returncode == -9
    crashed_at = (await api.get(run_id)).lease_epoch

    executor_factory(cp)
    (run,) = await api.wait_terminal([run_id])
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    assert run.attempt == 1  # the survivor took the lapsed lease over once
    steps = await check_run(api, run_id, sandbox_model, sandbox_providers)
    assert max(s.epoch for s in steps) > crashed_at

    sends = [
        r
        for r in sandbox_requests(sandbox_providers.url)
        if r["path"] == "/mail/send" and (r["idempotency_key"] or "").startswith(run_id)
    ]
    mail_result = next(
        s for s in steps if s.kind == "tool_result" and s.payload["tool"] == "send_email"
    )
    # Started, no result after the crash: an unknown outcome, settled by asking
    # the mail provider for the message stamped with the call's key, and sent
    # (with that same key) only if it has none.
    assert mail_result.payload["status"] == "ok"
    assert len(sends) == 1
    found_by_lookup = "lookup" in (mail_result.payload.get("resolution") or "")
    assert found_by_lookup == (point == "executor.tool.after_response")
    lookups = [
        r
        for r in sandbox_requests(sandbox_providers.url)
        if r["path"] == "/mail/search" and (r["idempotency_key"] or "").startswith(run_id)
    ]
    # A decision that calls a tool right away commits with that call's tool_started (one
    # commit): killed after it, the call is cut off just as after tool.after_started_commit.
    cut_off = point in (
        "executor.decision.after_commit",
        "executor.tool.after_started_commit",
        "executor.tool.after_response",
    )
    assert len(lookups) == (1 if cut_off else 0)


# A write cut off by a crash between `tool_started` and its result, by class:
# the payments provider replays the first answer for the same key; a chat post
# (no key, no lookup) waits for a person, who says what happened.
CUT_OFF_WRITES = [
    ("charger", "create_charge", "executor.tool.after_started_commit"),
    ("charger", "create_charge", "executor.tool.after_response"),
    ("poster", "chat_post", "executor.tool.after_started_commit"),
    ("poster", "chat_post", "executor.tool.after_response"),
    # The decision and the post's tool_started land in one commit; killed right after it,
    # the post (no key) is never sent again: it waits for a person like any cut-off post.
    ("poster", "chat_post", "executor.decision.after_commit"),
]


@pytest.mark.parametrize(("model", "tool", "point"), CUT_OFF_WRITES)
async def test_a_write_cut_off_by_a_crash_is_settled_by_its_class_and_happens_once(
    stack, executor_factory, sandbox_model, sandbox_providers, db, model, tool, point
):
    cp, api = stack
    await api.publish(model, model, [tool])
    run_id = await api.start(model)
    (doomed,) = executor_factory(cp, AGENTRUN_FAULTS=f"{point}=kill@1")
    await eventually(lambda: not doomed.alive, timeout=30, message=f"{point} never fired")
    if point == "executor.decision.after_commit":
        await assert_one_transaction(db, run_id, ["model_decision", "tool_started"])
    executor_factory(cp)
    provider = "payments" if tool == "create_charge" else "chat"

    def effects() -> list[dict]:
        found = sandbox_effects(sandbox_providers.url, provider)
        return [e for e in found if (e["key"] or "").startswith(run_id)]

    if tool == "chat_post":
        unknown = await eventually(lambda: api.awaiting_person(run_id), timeout=30)
        assert unknown.payload["status"] == "unknown"
        assert len(effects()) == (1 if point == "executor.tool.after_response" else 0)
        # The person checks the channel, as the test can.
        await api.resolve_unknown(run_id, unknown.seq, "happened" if effects() else "retry")
    (run,) = await api.wait_terminal([run_id])
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    await check_run(api, run_id, sandbox_model, sandbox_providers)
    assert_effects_at_most_once(effects(), provider)
    assert len(effects()) == 1


async def assert_one_transaction(db, run_id: str, kinds: list[str]) -> None:
    """The log's steps after the input are `kinds`, written by one transaction (one commit:
    the same transaction time, epoch and writer)."""
    rows = await db.fetch(
        "SELECT kind, epoch, created_at FROM steps WHERE run_id = $1 AND seq > 0 ORDER BY seq",
        uuid.UUID(run_id),
    )
    assert [r["kind"] for r in rows] == kinds
    assert len({(r["epoch"], r["created_at"]) for r in rows}) == 1


async def test_a_paused_executor_is_fenced_and_writes_nothing_after_its_lease_is_taken(
    stack, executor_factory, sandbox_model, sandbox_providers, db
):
    cp, api = stack
    # Hold the first executor inside the crm_lookup call, then freeze it there.
    set_fault(sandbox_providers.url, provider="crm", mode="delay", delay_ms=1500, count=1)
    run_id = await api.start("writer")
    (paused,) = executor_factory(cp)
    await eventually(lambda: _started_tools(db, run_id), message="tool never started")
    old_epoch = (await api.get(run_id)).lease_epoch
    paused.stop()
    try:
        executor_factory(cp)
        await eventually(
            lambda: _epoch_above(api, run_id, old_epoch), timeout=30, message="no takeover"
        )
    finally:
        paused.cont()
    (run,) = await api.wait_terminal([run_id])
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    steps = await check_run(api, run_id, sandbox_model, sandbox_providers)
    old = [s for s in steps if s.epoch == old_epoch]
    assert [s.kind for s in old] == ["model_decision", "tool_started"]
    # The old executor woke up, got its reply, tried to commit and was fenced.
    await eventually(lambda: "fenced" in paused.log_tail(200).lower(), timeout=15)
    assert paused.alive


async def _started_tools(db, run_id: str) -> bool:
    return bool(
        await db.fetchval(
            "SELECT count(*) FROM steps WHERE run_id = $1 AND kind = 'tool_started'", run_id
        )
    )


async def _epoch_above(api: Api, run_id: str, epoch: int) -> bool:
    """Leased again since `epoch` (only a lease raises it): running there, or already done
    (a taken-over run may finish within one poll of being claimed; CI once saw it do so)."""
    run = await api.get(run_id)
    return run.lease_epoch > epoch


async def test_many_executors_complete_every_run_once(
    stack, executor_factory, sandbox_model, sandbox_providers
):
    cp, api = stack
    run_ids = [await api.start("writer", f"lead {i}") for i in range(30)]
    executor_factory(cp, count=4, AGENTRUN_CAPACITY=4)
    runs = await api.wait_terminal(run_ids, within=90)
    assert {r.status for r in runs} == {run_pb2.RUN_STATUS_COMPLETED}
    assert {r.attempt for r in runs} == {0}  # nobody lost a lease, nothing was taken over
    for run_id in run_ids:
        steps = await check_run(api, run_id, sandbox_model, sandbox_providers)
        assert len({s.epoch for s in steps if s.epoch}) == 1


async def test_control_plane_restart_mid_run(
    stack, executor_factory, sandbox_model, sandbox_providers
):
    cp, api = stack
    set_fault(sandbox_model.url, delay_ms=150)
    try:
        run_ids = [await api.start("writer", f"lead {i}") for i in range(8)]
        executor_factory(cp, count=2)
        await eventually(lambda: _some_progress(api, run_ids), timeout=30)
        cp.kill()
        cp.restart()  # same port: the client channel reconnects by itself
        runs = await api.wait_terminal(run_ids, within=90)
    finally:
        clear_faults(sandbox_model.url)
    assert {r.status for r in runs} == {run_pb2.RUN_STATUS_COMPLETED}
    for run_id in run_ids:
        await check_run(api, run_id, sandbox_model, sandbox_providers)


async def _some_progress(api: Api, run_ids: list[str]) -> bool:
    counts = [(await api.get(r)).counters.steps for r in run_ids]
    return sum(counts) >= 6


async def test_postgres_restart_mid_run(
    stack, executor_factory, sandbox_model, sandbox_providers, embedded_pg
):
    cp, api = stack
    set_fault(sandbox_model.url, delay_ms=150)
    try:
        run_ids = [await api.start("writer", f"lead {i}") for i in range(8)]
        executor_factory(cp, count=2)
        await eventually(lambda: _some_progress(api, run_ids), timeout=30)
        embedded_pg.kill()
        await asyncio.sleep(0.5)  # Postgres stays down for a moment (not a synchronisation)
        embedded_pg.restart()
        runs = await api.wait_terminal(run_ids, within=90)
    finally:
        clear_faults(sandbox_model.url)
    assert {r.status for r in runs} == {run_pb2.RUN_STATUS_COMPLETED}
    for run_id in run_ids:
        await check_run(api, run_id, sandbox_model, sandbox_providers)


async def test_a_sleeping_run_is_held_by_nobody_and_wakes_when_due(
    stack, executor_factory, sandbox_model, sandbox_providers
):
    cp, api = stack
    await api.publish("sleeper", "sleepy", ["sleep", "echo"])
    run_id = await api.start("sleeper")
    executor_factory(cp)

    async def parked() -> run_pb2.Run | None:
        run = await api.get(run_id)
        return run if run.status == run_pb2.RUN_STATUS_WAITING else None

    run = await eventually(parked, timeout=20)
    assert (run.wait_reason, run.lease_owner) == ("sleep", "")
    wake = run.wake_time.ToDatetime().timestamp()
    (run,) = await api.wait_terminal([run_id])
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    steps = await check_run(api, run_id, sandbox_model, sandbox_providers)
    park = next(s for s in steps if s.kind == "park")
    resumed = [s for s in steps if s.seq > park.seq]
    assert resumed and all(s.epoch > park.epoch for s in resumed)
    assert run.finish_time.ToDatetime().timestamp() >= wake


async def test_random_kills_at_random_fault_points_lose_nothing_and_repeat_nothing(
    stack, executor_factory, sandbox_model, sandbox_providers
):
    """The randomized version: executors die at any fault point; the survivors' heirs go on."""
    cp, api = stack
    run_ids = [await api.start("writer", f"lead {i}") for i in range(20)]
    kills, seed = 0, 0

    def spawn():
        nonlocal seed
        seed += 1
        (proc,) = executor_factory(
            cp, AGENTRUN_FAULTS_RANDOM="0.04", AGENTRUN_FAULTS_SEED=str(seed), AGENTRUN_CAPACITY=6
        )
        return proc

    fleet = [spawn(), spawn()]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        runs = [await api.get(r) for r in run_ids]
        if all(r.status in (run_pb2.RUN_STATUS_COMPLETED, run_pb2.RUN_STATUS_FAILED) for r in runs):
            break
        for i, proc in enumerate(fleet):
            if not proc.alive:
                assert proc.returncode == -9, proc.log_tail()
                kills += 1
                fleet[i] = spawn()
        await asyncio.sleep(0.3)  # a polling interval, not a synchronisation
    runs = await api.wait_terminal(run_ids, within=5)
    assert {r.status for r in runs} == {run_pb2.RUN_STATUS_COMPLETED}, [r.error for r in runs]
    assert kills > 0, "no fault fired: the test exercised nothing"
    unknowns = 0
    for run_id in run_ids:
        steps = await check_run(api, run_id, sandbox_model, sandbox_providers)
        unknowns += sum(s.kind == "tool_result" and s.payload["status"] == "unknown" for s in steps)
    print(f"random crash test: runs={len(run_ids)} kills={kills} unknown outcomes={unknowns}")
