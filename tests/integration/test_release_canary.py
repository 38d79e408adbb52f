"""Canary before work (issue 41), with real processes.

The release gate is on by default. An executor of a release that never passed a canary
connects, and the control plane canaries that release by itself (the self-check): the
contract run, a session turn and a fast-path turn, pinned to the release. Only then does
the release take new runs; no operator step. A release whose canary fails (its executors
started with AGENTRUN_FAULTS arming the canary's own fault point, so the no-op tool's
result is never committed: a real process failing on a real path) is routed no new run
while every health check is green, and `releases show` names the failing stage. A healthy
executor of that release that connects later checks it again. AGENTRUN_RELEASE_GATE=off
is explicit and the control plane says so at start.

The check's claim across replicas (one at a time per release, lapsing with a crashed
replica) is tested on the store.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from datetime import UTC, datetime, timedelta

import asyncpg
import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentrun.v1 import release_pb2, release_pb2_grpc, run_pb2
from control_plane.deploys import releases
from control_plane.deploys.canary import CANARY_WORKSPACE
from control_plane.store import canary as canary_store
from control_plane.store import releases as release_store
from tests.harness import auth
from tests.harness.agentrun_api import Api
from tests.harness.cli import agentrun
from tests.harness.processes import ControlPlane, ManagedProcess
from tests.harness.waiting import eventually

CLAIMED = re.compile(r"claimed run (\S+) of workspace (\S+) \(epoch \d+")
BREAK_THE_CANARY = {"AGENTRUN_FAULTS": "executor.canary.after_tool_started=raise"}


def cli(address: str, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    return agentrun(address, key, *args, timeout=60)


def claims(process: ManagedProcess) -> list[tuple[str, str]]:
    """(run id, workspace) of each assignment the executor logged, in order."""
    return CLAIMED.findall(process.log_path.read_text())


async def show(stub: release_pb2_grpc.ReleaseServiceStub, name: str) -> release_pb2.Release:
    """The release (empty until an executor of it said Hello)."""
    try:
        return (await stub.GetRelease(release_pb2.GetReleaseRequest(name=name))).release
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.NOT_FOUND:
            raise
        return release_pb2.Release()


async def canary_runs(db_url: str) -> int:
    conn = await asyncpg.connect(db_url)
    try:
        return await conn.fetchval(
            "SELECT count(*) FROM runs WHERE workspace_id = $1", CANARY_WORKSPACE
        )
    finally:
        await conn.close()


def said(cp: ControlPlane, text: str) -> bool:
    return text in cp.process.log_path.read_text()


async def test_a_release_takes_new_runs_only_once_its_own_self_check_passed(
    db_url, control_plane, executor_factory
):
    cp = control_plane(db_url)  # the gate is on by default
    api = await Api.connect(cp.address, db_url, "acme")
    await api.publish("echo", "echo_input", ["echo"])
    key = await auth.platform_key(db_url)
    channel = auth.channel(cp.address, key)
    stub = release_pb2_grpc.ReleaseServiceStub(channel)
    assert said(cp, "release gate on")

    first = await api.start("echo", "waits for a release that passed its canary")
    (a,) = executor_factory(cp, AGENTRUN_RELEASE="A")
    (done,) = await api.wait_terminal([first], within=30)
    assert done.status == run_pb2.RUN_STATUS_COMPLETED and done.release == "A"
    # A's own log: its self-check's three runs (contract run, session turn, fast-path
    # turn) were its first assignments; the customer's run came after them.
    order = claims(a)
    assert [ws for _, ws in order[:3]] == [CANARY_WORKSPACE] * 3, order
    assert order[3] == (first, "acme"), order
    released = await show(stub, "A")
    assert released.HasField("canary_pass_time") and not released.canary_failed_stage
    assert said(cp, "release A takes new runs: PASS canary")
    assert "fast-path turn (on the fast path)" in cp.process.log_path.read_text()

    # B connects: newer than A, yet it takes new runs only once its own check passed.
    (b,) = executor_factory(cp, AGENTRUN_RELEASE="B")

    await eventually(lambda: _passed(stub, "B"), timeout=30, message="B's check never passed")
    (on_b,) = await api.wait_terminal([await api.start("echo", "after B's check")], within=30)
    assert on_b.release == "B"
    assert [ws for _, ws in claims(b)[:3]] == [CANARY_WORKSPACE] * 3
    # A reconnect of a release that passed runs no canary again.
    before = await canary_runs(db_url)
    b.terminate()
    (b2,) = executor_factory(cp, AGENTRUN_RELEASE="B")

    async def only_b2() -> bool:
        return list((await show(stub, "B")).executors) == ["executor-3"]

    await eventually(only_b2, timeout=30, message="B's second executor never connected")
    (again,) = await api.wait_terminal([await api.start("echo", "B again")], within=30)
    assert again.release == "B" and await canary_runs(db_url) == before
    assert claims(b2) == [(again.run_id, "acme")]
    await api.close()
    await channel.close()


async def test_a_release_whose_canary_fails_gets_no_new_run_while_every_health_check_is_green(
    db_url, control_plane, executor_factory
):
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url, "acme")
    await api.publish("echo", "echo_input", ["echo"])
    key = await auth.platform_key(db_url)
    channel = auth.channel(cp.address, key)
    stub = release_pb2_grpc.ReleaseServiceStub(channel)
    health = health_pb2_grpc.HealthStub(channel)

    executor_factory(cp, AGENTRUN_RELEASE="A")
    await eventually(lambda: _passed(stub, "A"), timeout=30, message="A's self-check never passed")
    (broken,) = executor_factory(cp, AGENTRUN_RELEASE="B", **BREAK_THE_CANARY)

    async def b_failed() -> bool:
        return bool((await show(stub, "B")).canary_failed_stage)

    await eventually(b_failed, timeout=40, message="B's self-check never failed")
    b = await show(stub, "B")
    assert b.canary_failed_stage == "tool result", b
    assert "canary_noop started" in b.canary_failure_reason, b
    assert b.HasField("canary_fail_time") and not b.HasField("canary_pass_time")
    assert b.executors == ["executor-2"] and not b.newest

    # B is the newer release and its executor is connected with free slots: without the
    # gate every new run would go to it. None does.
    started = [await api.start("echo", f"new {n}") for n in range(8)]
    done = await api.wait_terminal(started, within=40)
    assert {(r.status, r.release) for r in done} == {(run_pb2.RUN_STATUS_COMPLETED, "A")}
    assert [ws for _, ws in claims(broken)] == [CANARY_WORKSPACE]  # its canary, nothing else
    # ...while every health check is green: the control plane's, and B's executor lives.
    for service in ("", "agentrun.v1.RunService", "agentrun.v1.ExecutorService"):
        reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING, service
    async with httpx.AsyncClient(base_url=cp.http_url, timeout=5) as http:
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/readyz")).status_code == 200
    assert broken.alive

    # The operator's view names the stage, and so does a canary the operator runs.
    shown = await asyncio.to_thread(cli, cp.address, key, "releases", "show", "B")
    assert shown.returncode == 0, shown.stderr
    print(f"\n{shown.stdout}")
    assert "canary=failed:tool-result" in shown.stdout
    assert "canary failed at" in shown.stdout and "stage 'tool result'" in shown.stdout
    listed = await asyncio.to_thread(cli, cp.address, key, "releases", "list")
    assert "canary=failed:tool-result" in listed.stdout and "canary=passed" in listed.stdout
    ran = await asyncio.to_thread(cli, cp.address, key, "canary", "--release", "B")
    print(ran.stdout)
    assert ran.returncode == 1 and "at stage 'tool result'" in ran.stdout, ran.stdout

    # A healthy executor of B (the broken one gone) checks B again: B takes new runs.
    broken.kill()
    executor_factory(cp, AGENTRUN_RELEASE="B")
    await eventually(lambda: _passed(stub, "B"), timeout=30, message="B never passed")
    (on_b,) = await api.wait_terminal([await api.start("echo", "B fixed")], within=30)
    assert on_b.release == "B"
    await api.close()
    await channel.close()


async def _passed(stub: release_pb2_grpc.ReleaseServiceStub, name: str) -> bool:
    found = await show(stub, name)
    return found.HasField("canary_pass_time") and not found.canary_failed_stage


async def test_the_gate_off_is_explicit_said_at_start_and_runs_no_canary(
    db_url, control_plane, executor_factory
):
    cp = control_plane(db_url, AGENTRUN_RELEASE_GATE="off")
    assert said(cp, "release gate OFF (AGENTRUN_RELEASE_GATE=off)")
    api = await Api.connect(cp.address, db_url, "acme")
    await api.publish("echo", "echo_input", ["echo"])
    executor_factory(cp, AGENTRUN_RELEASE="A", **BREAK_THE_CANARY)
    (done,) = await api.wait_terminal([await api.start("echo", "no gate")], within=30)
    assert done.status == run_pb2.RUN_STATUS_COMPLETED and done.release == "A"
    assert await canary_runs(db_url) == 0
    await api.close()


async def test_one_self_check_at_a_time_per_release_and_a_crashed_checker_blocks_nobody(pool):
    t = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
    await release_store.seen(pool, "B")
    assert (await canary_store.take_check(pool, "B", 60, "e1", now=t)).taken
    # Another replica (another executor's connect) finds it held, and for how long...
    held = await canary_store.take_check(pool, "B", 60, "e2", now=t + timedelta(seconds=50))
    assert not held.taken and held.held_for == 10
    # ...until its holder's time is over (that replica crashed mid-check).
    later = t + timedelta(seconds=61)
    assert (await canary_store.take_check(pool, "B", 60, "e2", now=later)).taken
    await canary_store.check_done(pool, "B", "e2")
    # A failure: checked again for another executor, not for the one that checked it last.
    await canary_store.failed(pool, "B", "tool result", "no result")
    assert await canary_store.take_check(pool, "B", 60, "e2") == canary_store.Check(False)
    assert (await canary_store.take_check(pool, "B", 60, "e3")).taken
    await canary_store.check_done(pool, "B", "e3")
    (state,) = await release_store.list_releases(pool, 30, "B")
    shown = releases.to_proto(state, newest=False)
    assert (shown.canary_failed_stage, shown.canary_failure_reason) == ("tool result", "no result")
    # Passed: no more checks, and no failure shown.
    await release_store.canary_passed(pool, "B")
    assert await canary_store.take_check(pool, "B", 60, "e4") == canary_store.Check(False)
    (state,) = await release_store.list_releases(pool, 30, "B")
    assert not releases.to_proto(state, newest=False).HasField("canary_fail_time")


async def test_executors_of_one_release_connecting_to_two_replicas_at_once_make_one_check(
    db_url, control_plane, executor_factory
):
    replicas = [control_plane(db_url), control_plane(db_url)]
    api = await Api.connect(replicas[0].address, db_url, "acme")
    await api.publish("echo", "echo_input", ["echo"])
    for cp in replicas:
        executor_factory(cp, AGENTRUN_RELEASE="B")
    (done,) = await api.wait_terminal([await api.start("echo", "two replicas")], within=30)
    assert done.release == "B"
    assert await canary_runs(db_url) == 3  # one check: its run and its two turns
    checked = [cp for cp in replicas if said(cp, "release B: self-check canary")]
    assert len(checked) == 1
    await api.close()
