"""ForkRun with real processes: a fork copies the log up to a step and goes on from there,
never sending a call before the fork point again and asking the model only after it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid

import asyncpg
import grpc
import pytest

from agentrun.v1 import run_pb2
from control_plane.deploys.canary import CANARY_WORKSPACE
from tests.harness.agentrun_api import Api, LoggedStep, sandbox_requests
from tests.harness.auth import workspace_key
from tests.harness.invariants import assert_log_well_formed

TOOLS = ["crm_lookup", "send_email"]


@pytest.fixture
async def stack(db_url, control_plane, sandbox_model, sandbox_providers, executor_factory):
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url)
    # demo: crm_lookup, then send_email (a write), then the answer.
    await api.publish("mailer", "demo", TOOLS)
    executor_factory(cp)
    yield cp, api
    await api.close()


async def finished_source(api: Api) -> tuple[str, list[LoggedStep]]:
    run_id = await api.start("mailer")
    (run,) = await api.wait_terminal([run_id])
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    return run_id, await api.steps(run_id)


def result_of(steps: list[LoggedStep], tool: str) -> LoggedStep:
    (step,) = [s for s in steps if s.kind == "tool_result" and s.payload.get("tool") == tool]
    return step


async def fork(api: Api, run_id: str, from_seq: int, version: int = 0) -> run_pb2.Run:
    req = run_pb2.ForkRunRequest(run_id=run_id, from_seq=from_seq, agent_version=version)
    return (await api.runs.ForkRun(req)).run


def keyed(log: list[dict], run_id: str) -> list[dict]:
    return [r for r in log if (r.get("idempotency_key") or "").startswith(run_id)]


async def check_fork(
    api: Api, fork_id: str, source_id: str, source: list[LoggedStep], at: int
) -> list[LoggedStep]:
    """The fork finished; its log is the source's up to `at` (epoch 0), then the marker."""
    (run,) = await api.wait_terminal([fork_id])
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    steps = await api.steps(fork_id)
    assert_log_well_formed(steps)
    copied = [(s.seq, s.kind, s.ref_seq, s.payload) for s in steps[: at + 1]]
    assert copied == [(s.seq, s.kind, s.ref_seq, s.payload) for s in source[: at + 1]]
    assert {s.epoch for s in steps[: at + 2]} == {0}
    marker = steps[at + 1]
    assert marker.kind == "forked" and marker.payload["from_seq"] == at
    assert marker.payload["from_run_id"] == source_id
    assert marker.payload["forked_by"].startswith("key:")
    assert run.counters.steps == len(steps)
    return steps


async def test_a_fork_never_resends_a_call_before_its_point_and_asks_only_after_it(
    stack, db_url, sandbox_model, sandbox_providers
):
    cp, api = stack
    source_id, source = await finished_source(api)
    sent = keyed(sandbox_requests(sandbox_providers.url), source_id)
    assert [r["path"] for r in sent].count("/mail/send") == 1

    # 1. Right after the email's result: the model answers it again; nothing is sent.
    email = result_of(source, "send_email")
    first = await fork(api, source_id, email.seq)
    assert (first.forked_from_run_id, first.forked_from_seq) == (source_id, email.seq)
    assert first.agent_version == 1 and first.status == run_pb2.RUN_STATUS_QUEUED
    # 2. Right after the CRM lookup, under a newer version: the model decides again from
    # there, so this fork sends its own email (its own key), but never the lookup again.
    v2 = await api.publish("mailer", "demo", TOOLS)
    lookup = result_of(source, "crm_lookup")
    second = await fork(api, source_id, lookup.seq, version=v2)
    assert second.agent_version == v2

    steps_one = await check_fork(api, first.run_id, source_id, source, email.seq)
    steps_two = await check_fork(api, second.run_id, source_id, source, lookup.seq)
    providers = sandbox_requests(sandbox_providers.url)
    assert keyed(providers, first.run_id) == []
    assert [r["path"] for r in keyed(providers, second.run_id)] == ["/mail/send"]
    # The source's own calls went out once each, before any fork, and never again.
    assert keyed(providers, source_id) == sent

    model = sandbox_requests(sandbox_model.url)
    for fork_id, steps, at in (
        (first.run_id, steps_one, email.seq),
        (second.run_id, steps_two, lookup.seq),
    ):
        asked = sorted(r["seq"] for r in model if r.get("run_id") == fork_id)
        decided = [s.seq for s in steps if s.kind == "model_decision" and s.seq > at]
        assert asked == decided and min(asked) > at + 1, (asked, decided)
    # Only the source's run id ever asked for the copied decisions.
    source_asks = [r for r in model if r.get("run_id") == source_id]
    assert len(source_asks) == len([s for s in source if s.kind == "model_decision"])

    # Both ways: the forks name the source, and the source's forks are listed.
    listed = await api.runs.ListRuns(run_pb2.ListRunsRequest(forked_from_run_id=source_id))
    assert {r.run_id for r in listed.runs} == {first.run_id, second.run_id}
    assert (await api.get(second.run_id)).forked_from_seq == lookup.seq
    conn = await asyncpg.connect(db_url)
    try:
        audited = await conn.fetch(
            "SELECT object_id, actor, detail FROM audit_log WHERE action = 'run.forked'"
        )
    finally:
        await conn.close()
    assert {a["object_id"] for a in audited} == {first.run_id, second.run_id}


async def test_fork_points_that_would_resend_a_call_are_refused_and_write_nothing(
    stack, db_url, tmp_path
):
    cp, api = stack
    source_id, source = await finished_source(api)
    started = [s for s in source if s.kind == "tool_started"][0]
    finish = source[-1]

    async def refused(from_seq: int, version: int = 0, run_id: str = source_id) -> str:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await fork(api, run_id, from_seq, version)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
        return err.value.details() or ""

    detail = await refused(started.seq)
    assert "from_seq" in detail and f"seq {started.seq}" in detail and "crm_lookup" in detail
    assert "from_seq" in await refused(finish.seq)
    assert "no step 99" in await refused(99)
    # A version older than the source's is refused; a missing run is NOT_FOUND.
    v2 = await api.publish("mailer", "demo", TOOLS)
    newer = await api.runs.StartRun(
        run_pb2.StartRunRequest(agent_id="mailer", agent_version=v2, input="hi")
    )
    await api.wait_terminal([newer.run.run_id])
    assert "agent_version" in await refused(1, version=1, run_id=newer.run.run_id)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await fork(api, str(uuid.uuid4()), 1)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    other = await Api.connect(cp.address, db_url, "other")  # another tenant's run: not found
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await fork(other, source_id, 1)
    await other.close()
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    conn = await asyncpg.connect(db_url)
    try:
        # (The release self-check's runs are the canary workspace's.)
        runs = "SELECT count(*) FROM runs WHERE workspace_id <> $1"
        assert await conn.fetchval(runs, CANARY_WORKSPACE) == 2
        assert (
            await conn.fetchval("SELECT count(*) FROM audit_log WHERE action = 'run.forked'") == 0
        )
    finally:
        await conn.close()

    # The CLI, as an operator: `agentrun runs fork RUN --from-seq N`, then `runs forks RUN`.
    key = await workspace_key(db_url, "ws", role="operator")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRUN_")}
    env.update(AGENTRUN_API_KEY=key, AGENTRUN_WORKSPACE="ws", AGENTRUN_CONFIG=str(tmp_path / "c"))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "agentrun_cli", "--address", cp.address, *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)

    lookup = result_of(source, "crm_lookup")
    out = await asyncio.to_thread(cli, "runs", "fork", source_id, "--from-seq", str(lookup.seq))
    assert out.returncode == 0, out.stderr
    assert f"from {source_id} after step {lookup.seq}" in out.stdout
    bad = await asyncio.to_thread(cli, "runs", "fork", source_id, "--from-seq", str(started.seq))
    assert bad.returncode != 0 and "from_seq" in bad.stderr
    listed = await asyncio.to_thread(cli, "runs", "forks", source_id)
    assert listed.returncode == 0 and f"from step {lookup.seq}" in listed.stdout
