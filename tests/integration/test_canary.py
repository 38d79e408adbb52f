"""The contract canary with real processes (issue 15).

A healthy stack passes it in well under 10 s, through the whole path: the run's log
holds a decision, the no-op tool's start and result and a completion carrying the
protocol marker, and neither the model sandbox nor the provider sandbox saw a request.
A control plane whose fence admission is broken (fault point
control_plane.commit.fence_admission) keeps every health check green, and the canary
fails with a one-line verdict and exit code 1.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid

import asyncpg
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentrun.v1 import release_pb2, release_pb2_grpc, run_pb2
from control_plane.deploys.canary import CANARY_WORKSPACE, MARKER
from tests.harness import auth
from tests.harness.agentrun_api import Api, sandbox_effects, sandbox_requests
from tests.harness.cli import agentrun
from tests.harness.waiting import eventually


def cli(address: str, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    return agentrun(address, key, *args, timeout=60)


async def kinds_of(db_url: str, run_id: str) -> list[str]:
    conn = await asyncpg.connect(db_url)
    try:
        rows = await conn.fetch(
            "SELECT kind, payload FROM steps WHERE workspace_id = $1 AND run_id = $2 ORDER BY seq",
            CANARY_WORKSPACE,
            uuid.UUID(run_id),
        )
        return [r["kind"] for r in rows]
    finally:
        await conn.close()


async def test_the_canary_passes_on_a_healthy_stack_without_a_model_or_a_provider(
    db_url, control_plane, executor_factory, sandbox_model, sandbox_providers
):
    cp = control_plane(db_url)
    executor_factory(cp)
    key = await auth.platform_key(db_url)
    customer = await Api.connect(cp.address, db_url, "acme")
    await customer.publish("echo", "echo_input", ["echo"])
    channel = auth.channel(cp.address, key)
    stub = release_pb2_grpc.CanaryServiceStub(channel)

    # The executor connects: once it is there, the canary must pass.
    async def passes() -> bool:
        return (await stub.RunCanary(release_pb2.RunCanaryRequest())).passed

    await eventually(passes, timeout=30, message="the canary never passed")
    models, effects = (
        len(sandbox_requests(sandbox_model.url)),
        len(sandbox_effects(sandbox_providers.url)),
    )
    started = time.monotonic()
    done = await asyncio.to_thread(cli, cp.address, key, "canary")
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr + done.stdout
    (line,) = done.stdout.strip().splitlines()
    print(f"\n{line} (exit {done.returncode})")
    assert line.startswith("PASS") and "protocol marker" in line
    assert elapsed < 10
    resp = await stub.RunCanary(release_pb2.RunCanaryRequest(release="dev"))
    assert resp.passed and resp.status == "completed" and resp.release == "dev"
    assert await kinds_of(db_url, resp.run_id) == [
        "input",
        "model_decision",
        "tool_started",
        "tool_result",
        "model_decision",
        "finish",
    ]
    # No model was asked and no provider touched, for any of the canaries.
    assert len(sandbox_requests(sandbox_model.url)) == models
    assert len(sandbox_effects(sandbox_providers.url)) == effects
    # Canary runs are in no customer's list.
    listed = await customer.runs.ListRuns(run_pb2.ListRunsRequest(workspace_id="acme"))
    assert list(listed.runs) == []
    await customer.close()
    await channel.close()


async def test_a_broken_fence_admission_passes_every_health_check_and_fails_the_canary(
    db_url, control_plane, executor_factory
):
    cp = control_plane(db_url, AGENTRUN_FAULTS="control_plane.commit.fence_admission=refuse")
    executor_factory(cp)
    key = await auth.platform_key(db_url)
    channel = auth.channel(cp.address, key)
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "agentrun.v1.RunService", "agentrun.v1.ExecutorService"):
        reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    releases = release_pb2_grpc.ReleaseServiceStub(channel)

    async def connected() -> bool:
        listed = await releases.ListReleases(release_pb2.ListReleasesRequest())
        return any(r.name == "dev" and r.executors for r in listed.releases)

    await eventually(connected, timeout=30, message="the executor never connected")
    done = await asyncio.to_thread(
        cli, cp.address, key, "canary", "--release", "dev", "--timeout", "4"
    )
    assert done.returncode == 1, done.stdout + done.stderr
    (line,) = done.stdout.strip().splitlines()
    print(f"\n{line} (exit {done.returncode})")
    # Every commit is refused, the first one the model's decision: no tool ever starts.
    assert line.startswith("FAIL canary run") and "at stage 'tool started'" in line, line
    assert MARKER not in line
    # ...while the health checks are still green.
    reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    await channel.close()
