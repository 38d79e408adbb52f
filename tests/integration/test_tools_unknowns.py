"""Unknown outcomes of `none`-class writes: the run waits for a person, who decides once.

Real control plane, executors, Postgres and provider sandbox. Faults are
armed for one run's calls only (by its key prefix), before any executor runs.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import grpc
import pytest

from agentrun.v1 import run_pb2
from tests.harness.agentrun_api import Api, clear_faults, sandbox_effects, set_fault
from tests.harness.auth import workspace_key
from tests.harness.invariants import assert_log_well_formed
from tests.harness.waiting import eventually

CODE = grpc.StatusCode


@pytest.fixture
async def stack(db_url, control_plane, sandbox_providers):
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url)
    await api.publish("poster", "poster", ["chat_post"])
    yield cp, api
    await api.close()
    clear_faults(sandbox_providers.url)


async def start_with_fault(api: Api, url: str, agent: str, provider: str, **fault) -> str:
    """A queued run whose calls to `provider` meet `fault` (armed before anything runs)."""
    run_id = await api.start(agent)
    set_fault(url, provider=provider, key_prefix=f"{run_id}:", count=1, **fault)
    return run_id


def posts(url: str, run_id: str) -> list[dict]:
    return [e for e in sandbox_effects(url, "chat") if (e["key"] or "").startswith(run_id)]


async def parked_unknown(api: Api, run_id: str):
    return await eventually(
        lambda: api.awaiting_person(run_id), timeout=30, message="run never waited for a person"
    )


LOST = {"mode": "drop_response", "delay_ms": 0}  # the post happens, the answer is lost
FAILED = {"mode": "error", "status": 500}  # a 5xx: the client cannot tell either


async def as_operator(cp, db_url, ws: str, name: str) -> Api:
    """An Api calling with `name`'s own operator key (a decision records its caller)."""
    return Api(cp.address, ws, await workspace_key(db_url, ws, "operator", name))


@pytest.mark.parametrize(
    ("fault", "decision", "status", "sent"),
    [
        (LOST, "happened", run_pb2.RUN_STATUS_COMPLETED, 1),
        (FAILED, "not_happened", run_pb2.RUN_STATUS_COMPLETED, 0),
        (FAILED, "retry", run_pb2.RUN_STATUS_COMPLETED, 1),
        (FAILED, "fail_run", run_pb2.RUN_STATUS_FAILED, 0),
    ],
)
async def test_an_unknown_post_waits_for_a_person_and_goes_on_as_decided(
    stack, executor_factory, sandbox_providers, fault, decision, status, sent, db_url
):
    cp, api = stack
    url = sandbox_providers.url
    run_id = await start_with_fault(api, url, "poster", "chat", **fault)
    executor_factory(cp)
    unknown = await parked_unknown(api, run_id)
    run = await api.get(run_id)
    assert (run.status, run.wait_reason, run.lease_owner) == (
        run_pb2.RUN_STATUS_WAITING,
        "human",
        "",
    )
    assert not run.HasField("wake_time"), "a person's wait has no wake time"
    assert unknown.payload["status"] == "unknown" and unknown.payload["tool"] == "chat_post"
    assert len(posts(url, run_id)) == (1 if fault is LOST else 0)  # never sent twice by itself

    alice = await as_operator(cp, db_url, api.ws, "ops-alice")
    decided = await alice.resolve_unknown(run_id, unknown.seq, decision, "ops-alice", "checked")
    await alice.close()
    assert (
        decided.step.ref_seq == unknown.seq and decided.step.kind == run_pb2.STEP_KIND_TOOL_RESULT
    )
    (run,) = await api.wait_terminal([run_id], within=30)
    assert run.status == status, run.error
    assert len(posts(url, run_id)) == sent
    steps = await api.steps(run_id)
    assert_log_well_formed(steps)
    decision_step = next(s for s in steps if s.payload.get("decision"))
    assert decision_step.payload | {"resolution": None} == {
        "call_id": unknown.payload["call_id"],
        "tool": "chat_post",
        "status": "ok" if decision == "happened" else "error",
        "output": None,
        "resolution": None,
        "decision": decision,
        "decided_by": "key:ops-alice",
        "note": "checked",
        **({} if decision == "happened" else {"error": decision_step.payload["error"]}),
    }
    started = [s for s in steps if s.kind == "tool_started"]
    assert len(started) == (2 if decision == "retry" else 1)
    if decision == "retry":  # a new attempt is a new step, so a new key
        assert started[1].payload["idempotency_key"] == f"{run_id}:{started[1].seq}"
        assert posts(url, run_id)[0]["key"] == started[1].payload["idempotency_key"]
    if decision == "happened":  # the model read the decision as the call's result
        assert "key:ops-alice checked and decided: it happened (note: checked)" in run.output
    if decision == "fail_run":
        assert "key:ops-alice failed the run: checked" in run.error


async def test_two_people_deciding_at_once_resolve_it_exactly_once(
    stack, executor_factory, sandbox_providers, db_url
):
    cp, api = stack
    run_id = await start_with_fault(api, sandbox_providers.url, "poster", "chat", **LOST)
    executor_factory(cp)
    unknown = await parked_unknown(api, run_id)
    people = [f"person-{i}" for i in range(6)]
    callers = [await as_operator(cp, db_url, api.ws, who) for who in people]
    outcomes = await asyncio.gather(
        *(
            c.resolve_unknown(run_id, unknown.seq, "happened", who)
            for c, who in zip(callers, people, strict=True)
        ),
        return_exceptions=True,
    )
    won = [o for o in outcomes if isinstance(o, run_pb2.ResolveUnknownOutcomeResponse)]
    lost = [o for o in outcomes if isinstance(o, grpc.aio.AioRpcError)]
    assert len(won) == 1 and len(lost) == len(people) - 1, outcomes
    winner = won[0].step
    assert {e.code() for e in lost} == {CODE.ABORTED}
    who = [w for w in people if f"by key:{w}" in lost[0].details()]
    assert len(who) == 1 and f"step {winner.seq}" in lost[0].details()
    (run,) = await api.wait_terminal([run_id], within=30)
    assert run.status == run_pb2.RUN_STATUS_COMPLETED
    steps = await api.steps(run_id)
    assert [s.seq for s in steps if s.ref_seq == unknown.seq] == [winner.seq]
    # A late decision, after the run moved on, still names the winner.
    latecomer = await as_operator(cp, db_url, api.ws, "latecomer")
    with pytest.raises(grpc.aio.AioRpcError) as late:
        await latecomer.resolve_unknown(run_id, unknown.seq, "retry", "latecomer")
    assert late.value.code() == CODE.ABORTED and who[0] in late.value.details()


async def test_bad_decisions_are_refused_naming_the_problem(
    stack, executor_factory, sandbox_providers, db_url
):
    cp, api = stack
    run_id = await start_with_fault(api, sandbox_providers.url, "poster", "chat", **LOST)
    executor_factory(cp)
    unknown = await parked_unknown(api, run_id)

    async def refused(code, *words, caller=api, **fields):
        request = {
            "workspace_id": caller.ws,
            "run_id": run_id,
            "seq": unknown.seq,
            "decided_by": "tester",
            "decision": run_pb2.OUTCOME_DECISION_HAPPENED,
            **fields,
        }
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await caller.runs.ResolveUnknownOutcome(run_pb2.ResolveUnknownOutcomeRequest(**request))
        assert err.value.code() == code, err.value.details()
        assert all(word in err.value.details() for word in words), err.value.details()

    await refused(CODE.INVALID_ARGUMENT, "run_id", run_id="not-a-uuid")
    await refused(CODE.INVALID_ARGUMENT, "seq", seq=0)
    await refused(CODE.INVALID_ARGUMENT, "decision", decision=0)
    # Who decides is the caller's credential: naming someone else is refused.
    await refused(CODE.PERMISSION_DENIED, "decided_by", decided_by="someone-else")
    await refused(CODE.INVALID_ARGUMENT, "decided_by", decided_by="x" * 300)
    await refused(CODE.INVALID_ARGUMENT, "note", note="x" * 5000)
    await refused(CODE.NOT_FOUND, "not found", run_id="00000000-0000-4000-8000-000000000000")
    await refused(CODE.PERMISSION_DENIED, "workspace_id", workspace_id="someone-else")
    stranger = await as_operator(cp, db_url, "someone-else", "tester")
    await refused(CODE.NOT_FOUND, "not found", caller=stranger)
    await refused(CODE.NOT_FOUND, "no step 99", seq=99)
    await refused(CODE.FAILED_PRECONDITION, "model_decision", seq=1)
    await refused(CODE.FAILED_PRECONDITION, "tool_started", seq=unknown.seq - 1)
    assert (await api.get(run_id)).wait_reason == "human"  # nothing was written

    await api.runs.CancelRun(run_pb2.CancelRunRequest(workspace_id=api.ws, run_id=run_id))
    await refused(CODE.FAILED_PRECONDITION, "cancelled")


async def test_a_call_the_model_may_not_make_is_an_error_it_recovers_from_and_nothing_is_sent(
    stack, executor_factory, sandbox_providers
):
    """An unknown tool, then arguments failing the schema: error results, no request."""
    cp, api = stack
    await api.publish("clumsy", "bad_tool", ["send_email"])
    run_id = await api.start("clumsy")
    executor_factory(cp)
    (run,) = await api.wait_terminal([run_id], within=30)
    assert run.status == run_pb2.RUN_STATUS_COMPLETED and run.output == "recovered"
    steps = await api.steps(run_id)
    results = [s.payload for s in steps if s.kind == "tool_result"]
    assert [r["status"] for r in results] == ["error", "error"]
    assert "unknown tool: 'delete_everything'" in results[0]["error"]
    assert (
        "invalid arguments for send_email" in results[1]["error"] and "'to'" in results[1]["error"]
    )
    assert not [s for s in steps if s.kind == "tool_started"]
    assert run.counters.tool_calls == 0
    assert not [e for e in sandbox_effects(sandbox_providers.url) if run_id in (e["key"] or "")]


async def test_the_cli_decides_an_unknown_outcome(
    stack, executor_factory, sandbox_providers, db_url
):
    cp, api = stack
    run_id = await start_with_fault(api, sandbox_providers.url, "poster", "chat", **LOST)
    executor_factory(cp)
    unknown = await parked_unknown(api, run_id)
    argv = [
        sys.executable,
        "-m",
        "agentrun_cli",
        "--address",
        cp.address,
        "--workspace",
        api.ws,
        "runs",
        "resolve",
        run_id,
        str(unknown.seq),
        "happened",
        "--by",
        "cli-user",
        "--note",
        "saw it",
    ]
    key = await workspace_key(db_url, api.ws, "operator", "cli-user")
    env = {**os.environ, "AGENTRUN_API_KEY": key}
    done = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    assert "chat_post ok" in done.stdout and "cli-user" in done.stdout
    (run,) = await api.wait_terminal([run_id], within=30)
    assert run.status == run_pb2.RUN_STATUS_COMPLETED
    again = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, timeout=60, env=env
    )
    assert again.returncode != 0 and "ABORTED" in again.stderr + again.stdout
