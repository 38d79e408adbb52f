"""The public gRPC API against a real control plane and Postgres: happy paths and bad input."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from agentrun.v1 import agent_pb2, agent_pb2_grpc, run_pb2, run_pb2_grpc
from control_plane.ground.config import ServerConfig
from control_plane.server import start as start_server
from tests.harness import auth
from tests.harness.auth import workspace_key

GRPCURL = shutil.which("grpcurl") or str(Path(sys.executable).parent / "grpcurl")


@pytest.fixture
async def acme_key(db_url):
    return await workspace_key(db_url, "acme")


@pytest.fixture
async def channel(server, acme_key):
    async with auth.channel(f"127.0.0.1:{server.port}", acme_key) as ch:
        yield ch


@pytest.fixture
def agents(channel):
    return agent_pb2_grpc.AgentServiceStub(channel)


@pytest.fixture
def runs(channel):
    return run_pb2_grpc.RunServiceStub(channel)


async def publish(agents, ws="acme", agent_id="triage", **limits):
    await agents.CreateAgent(agent_pb2.CreateAgentRequest(workspace_id=ws, agent_id=agent_id))
    spec = agent_pb2.AgentSpec(
        model="writer",
        instructions="be brief",
        tools=["echo"],
        limits=agent_pb2.RunLimits(**limits),
    )
    resp = await agents.PublishAgentVersion(
        agent_pb2.PublishAgentVersionRequest(workspace_id=ws, agent_id=agent_id, spec=spec)
    )
    return resp.version


async def expect_error(call, code: grpc.StatusCode, *words: str) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == code, info.value.details()
    for word in words:
        assert word in info.value.details()
    return info.value.details()


async def test_agent_versions_are_numbered_and_limits_copied_at_admission(agents, runs):
    v1 = await publish(agents, max_steps=7)
    assert v1.version == 1 and v1.spec.limits.max_steps == 7
    started = await runs.StartRun(
        run_pb2.StartRunRequest(workspace_id="acme", agent_id="triage", input="hello")
    )
    run = started.run
    assert started.created and run.status == run_pb2.RUN_STATUS_QUEUED
    assert (run.agent_version, run.limits.max_steps) == (1, 7)
    # A new version changes nothing for the admitted run.
    spec = agent_pb2.AgentSpec(model="writer", limits=agent_pb2.RunLimits(max_steps=99))
    v2 = await agents.PublishAgentVersion(
        agent_pb2.PublishAgentVersionRequest(workspace_id="acme", agent_id="triage", spec=spec)
    )
    assert v2.version.version == 2
    again = await runs.GetRun(run_pb2.GetRunRequest(workspace_id="acme", run_id=run.run_id))
    assert (again.run.agent_version, again.run.limits.max_steps) == (1, 7)
    steps = await runs.ListRunSteps(
        run_pb2.ListRunStepsRequest(workspace_id="acme", run_id=run.run_id)
    )
    assert [(s.seq, s.kind) for s in steps.steps] == [(0, run_pb2.STEP_KIND_INPUT)]
    assert json.loads(steps.steps[0].payload_json) == {"text": "hello"}


async def test_a_start_of_the_latest_version_admits_the_one_published_last_on_any_replica(
    agents, runs, db_url, acme_key
):
    """A replica remembers the versions it admitted (store/agents.py Versions); a version
    published since, here through another replica, is the one admitted next."""

    async def start(version: int = 0, request_id: str = "") -> run_pb2.StartRunResponse:
        return await runs.StartRun(
            run_pb2.StartRunRequest(
                workspace_id="acme",
                agent_id="triage",
                input="hi",
                agent_version=version,
                request_id=request_id,
            )
        )

    await publish(agents, max_steps=7)
    assert (await start()).run.agent_version == 1
    other = await start_server(ServerConfig(database_url=db_url, listen="127.0.0.1:0"))
    try:
        async with auth.channel(f"127.0.0.1:{other.port}", acme_key) as ch:
            spec = agent_pb2.AgentSpec(model="writer", limits=agent_pb2.RunLimits(max_steps=9))
            await agent_pb2_grpc.AgentServiceStub(ch).PublishAgentVersion(
                agent_pb2.PublishAgentVersionRequest(
                    workspace_id="acme", agent_id="triage", spec=spec
                )
            )
    finally:
        await other.stop(grace=0)
    latest = (await start(request_id="r1")).run
    assert (latest.agent_version, latest.limits.max_steps) == (2, 9)
    assert (await start()).run.agent_version == 2
    pinned = (await start(version=1)).run
    assert (pinned.agent_version, pinned.limits.max_steps) == (1, 7)
    # A used request_id still names its run, whatever the cache holds.
    replay = await start(request_id="r1")
    assert not replay.created and replay.run.run_id == latest.run_id
    await expect_error(start(version=3), grpc.StatusCode.NOT_FOUND, "no version 3")


async def test_start_run_with_request_id_is_idempotent(agents, runs):
    await publish(agents)
    req = run_pb2.StartRunRequest(
        workspace_id="acme", agent_id="triage", input="x", request_id="k1"
    )
    first = await runs.StartRun(req)
    second = await runs.StartRun(req)
    assert first.created and not second.created
    assert first.run.run_id == second.run.run_id
    listed = await runs.ListRuns(run_pb2.ListRunsRequest(workspace_id="acme"))
    assert len(listed.runs) == 1


async def test_list_runs_pages_through_everything_once(agents, runs):
    await publish(agents)
    ids = set()
    for i in range(7):
        r = await runs.StartRun(
            run_pb2.StartRunRequest(workspace_id="acme", agent_id="triage", input=str(i))
        )
        ids.add(r.run.run_id)
    seen, token, pages = [], "", 0
    while True:
        page = await runs.ListRuns(
            run_pb2.ListRunsRequest(workspace_id="acme", page_size=3, page_token=token)
        )
        seen += [r.run_id for r in page.runs]
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert pages == 3 and len(seen) == 7 and set(seen) == ids


async def test_cancel_ends_the_run_and_a_second_cancel_is_refused(agents, runs):
    await publish(agents)
    run = (
        await runs.StartRun(
            run_pb2.StartRunRequest(workspace_id="acme", agent_id="triage", input="x")
        )
    ).run
    resp = await runs.CancelRun(
        run_pb2.CancelRunRequest(workspace_id="acme", run_id=run.run_id, reason="no longer needed")
    )
    assert resp.run.status == run_pb2.RUN_STATUS_CANCELLED
    assert resp.run.error == "no longer needed"
    await expect_error(
        runs.CancelRun(run_pb2.CancelRunRequest(workspace_id="acme", run_id=run.run_id)),
        grpc.StatusCode.FAILED_PRECONDITION,
        "already ended",
    )


async def test_watch_run_streams_from_an_offset_and_ends_when_terminal(agents, runs):
    await publish(agents)
    run = (
        await runs.StartRun(
            run_pb2.StartRunRequest(workspace_id="acme", agent_id="triage", input="x")
        )
    ).run
    await runs.CancelRun(run_pb2.CancelRunRequest(workspace_id="acme", run_id=run.run_id))
    events = [
        e
        async for e in runs.WatchRun(
            run_pb2.WatchRunRequest(workspace_id="acme", run_id=run.run_id, from_seq=1)
        )
    ]
    assert events[0].WhichOneof("event") == "run"
    assert events[0].run.status == run_pb2.RUN_STATUS_CANCELLED
    assert [e.step.seq for e in events[1:]] == [1]
    assert events[1].step.kind == run_pb2.STEP_KIND_FINISH


async def test_other_workspaces_runs_are_not_found(agents, runs, server, db_url):
    await publish(agents)
    run = (
        await runs.StartRun(
            run_pb2.StartRunRequest(workspace_id="acme", agent_id="triage", input="x")
        )
    ).run
    other_key = await workspace_key(db_url, "other")
    async with auth.channel(f"127.0.0.1:{server.port}", other_key) as other:
        other_runs = run_pb2_grpc.RunServiceStub(other)
        for ws in ("other", ""):  # the credential's workspace, typed or not
            details = await expect_error(
                other_runs.GetRun(run_pb2.GetRunRequest(workspace_id=ws, run_id=run.run_id)),
                grpc.StatusCode.NOT_FOUND,
                run.run_id,
            )
            assert "acme" not in details
        # Typing the other workspace's id does not make the key act there.
        await expect_error(
            other_runs.GetRun(run_pb2.GetRunRequest(workspace_id="acme", run_id=run.run_id)),
            grpc.StatusCode.PERMISSION_DENIED,
            "workspace_id",
        )


BAD_REQUESTS = [
    # An empty workspace_id means the credential's own workspace.
    (
        "GetRun",
        run_pb2.GetRunRequest(run_id="00000000-0000-0000-0000-000000000000"),
        grpc.StatusCode.NOT_FOUND,
        "not found",
    ),
    (
        "GetRun",
        run_pb2.GetRunRequest(workspace_id="acme", run_id="not-a-uuid"),
        grpc.StatusCode.INVALID_ARGUMENT,
        "run_id",
    ),
    (
        "GetRun",
        run_pb2.GetRunRequest(workspace_id="Acme!", run_id="x"),
        grpc.StatusCode.PERMISSION_DENIED,
        "workspace_id",
    ),
    (
        "GetRun",
        run_pb2.GetRunRequest(workspace_id="a" * 64, run_id="x"),
        grpc.StatusCode.INVALID_ARGUMENT,
        "workspace_id",
    ),
    (
        "GetRun",
        run_pb2.GetRunRequest(workspace_id="acme", run_id="00000000-0000-0000-0000-000000000000"),
        grpc.StatusCode.NOT_FOUND,
        "not found",
    ),
    (
        "StartRun",
        run_pb2.StartRunRequest(workspace_id="acme", agent_id="triage"),
        grpc.StatusCode.INVALID_ARGUMENT,
        "input",
    ),
    (
        "StartRun",
        run_pb2.StartRunRequest(workspace_id="acme", agent_id="ghost", input="x"),
        grpc.StatusCode.NOT_FOUND,
        "ghost",
    ),
    (
        "StartRun",
        run_pb2.StartRunRequest(workspace_id="acme", agent_id="triage", input="x" * (300 * 1024)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "input",
    ),
    (
        "StartRun",
        run_pb2.StartRunRequest(
            workspace_id="acme", agent_id="triage", input="x", agent_version=-1
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "agent_version",
    ),
    (
        "StartRun",
        run_pb2.StartRunRequest(
            workspace_id="acme", agent_id="triage", input="x", agent_version=42
        ),
        grpc.StatusCode.NOT_FOUND,
        "42",
    ),
    (
        "ListRuns",
        run_pb2.ListRunsRequest(workspace_id="acme", page_size=10_000),
        grpc.StatusCode.INVALID_ARGUMENT,
        "page_size",
    ),
    (
        "ListRuns",
        run_pb2.ListRunsRequest(workspace_id="acme", page_token="garbage"),
        grpc.StatusCode.INVALID_ARGUMENT,
        "page_token",
    ),
    (
        "ListRuns",
        run_pb2.ListRunsRequest(workspace_id="acme", status=99),
        grpc.StatusCode.INVALID_ARGUMENT,
        "status",
    ),
    (
        "ListRunSteps",
        run_pb2.ListRunStepsRequest(workspace_id="acme", run_id="x", from_seq=0),
        grpc.StatusCode.INVALID_ARGUMENT,
        "run_id",
    ),
    (
        "CancelRun",
        run_pb2.CancelRunRequest(
            workspace_id="acme", run_id="00000000-0000-0000-0000-000000000000"
        ),
        grpc.StatusCode.NOT_FOUND,
        "not found",
    ),
]


@pytest.mark.parametrize(("method", "request_msg", "code", "word"), BAD_REQUESTS)
async def test_bad_requests_are_refused_naming_the_field_and_write_nothing(
    agents, runs, db, method, request_msg, code, word
):
    await publish(agents)
    before = await db.fetchval("SELECT count(*) FROM runs")
    await expect_error(getattr(runs, method)(request_msg), code, word)
    assert await db.fetchval("SELECT count(*) FROM runs") == before


BAD_SPECS = [
    (agent_pb2.AgentSpec(), "spec.model"),
    (agent_pb2.AgentSpec(model="m", tools=["Bad Tool"]), "spec.tools[0]"),
    (agent_pb2.AgentSpec(model="m", tools=["echo", "echo"]), "spec.tools"),
    (
        agent_pb2.AgentSpec(model="m", limits=agent_pb2.RunLimits(max_steps=-1)),
        "spec.limits.max_steps",
    ),
]


@pytest.mark.parametrize(("spec", "field"), BAD_SPECS)
async def test_bad_agent_specs_name_the_field(agents, db, spec, field):
    await agents.CreateAgent(agent_pb2.CreateAgentRequest(workspace_id="acme", agent_id="a"))
    await expect_error(
        agents.PublishAgentVersion(
            agent_pb2.PublishAgentVersionRequest(workspace_id="acme", agent_id="a", spec=spec)
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        field,
    )
    assert await db.fetchval("SELECT count(*) FROM agent_versions") == 0


async def test_duplicate_agent_is_already_exists(agents):
    req = agent_pb2.CreateAgentRequest(workspace_id="acme", agent_id="a")
    await agents.CreateAgent(req)
    await expect_error(agents.CreateAgent(req), grpc.StatusCode.ALREADY_EXISTS, "'a'")


async def test_oversized_message_is_refused_and_the_server_keeps_serving(agents, runs, db):
    await publish(agents)
    huge = run_pb2.StartRunRequest(workspace_id="acme", agent_id="triage", input="x" * (5 << 20))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await runs.StartRun(huge)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "4194304" in info.value.details()  # names the limit
    assert await db.fetchval("SELECT count(*) FROM runs") == 0
    ok = await runs.StartRun(
        run_pb2.StartRunRequest(workspace_id="acme", agent_id="triage", input="small")
    )
    assert ok.created


async def grpcurl(*args: str) -> str:
    """Run grpcurl without blocking the event loop the in-process server shares."""
    proc = await asyncio.create_subprocess_exec(
        GRPCURL, "-plaintext", *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def test_grpcurl_lists_services_calls_get_run_and_health_is_serving(
    server, agents, runs, acme_key
):
    await publish(agents)
    run = (
        await runs.StartRun(
            run_pb2.StartRunRequest(workspace_id="acme", agent_id="triage", input="via grpcurl")
        )
    ).run
    addr = f"127.0.0.1:{server.port}"
    listed = (await grpcurl(addr, "list")).split()
    for service in (
        "agentrun.v1.RunService",
        "agentrun.v1.AgentService",
        "agentrun.v1.ExecutorService",
        "grpc.health.v1.Health",
    ):
        assert service in listed
    got = json.loads(
        await grpcurl(
            "-d",
            json.dumps({"workspace_id": "acme", "run_id": run.run_id}),
            "-H",
            f"authorization: Bearer {acme_key}",
            addr,
            "agentrun.v1.RunService/GetRun",
        )
    )
    assert got["run"]["run_id"] == run.run_id and got["run"]["input"] == "via grpcurl"
    health = json.loads(await grpcurl(addr, "grpc.health.v1.Health/Check"))
    assert health["status"] == "SERVING"
