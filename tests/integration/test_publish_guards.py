"""Tools known at publish time, runs only on executors carrying their tools, the trifecta warning.

Real control plane and Postgres; the executors here are raw Connect streams that
declare their tools in Hello, as executor/worker.py does from its catalogue.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import pytest

from agentrun.v1 import agent_pb2, approval_pb2, executor_pb2, executor_pb2_grpc
from control_plane.ground.config import ServerConfig
from control_plane.server import start as start_server
from tests.harness import auth
from tests.harness.agentrun_api import Api
from tests.harness.waiting import eventually

WS = "acme"
TRIFECTA = ["read_thread", "crm_lookup", "send_email"]


@pytest.fixture
async def api(server, db_url) -> AsyncIterator[Api]:
    client = await Api.connect(f"127.0.0.1:{server.port}", db_url, WS)
    yield client
    await client.close()


class RawExecutor:
    """One Connect stream declaring `tools`; collects its assignments."""

    def __init__(self, channel: grpc.aio.Channel, name: str, tools: Sequence[str]) -> None:
        self.name = name
        self.tools = tools
        self._call = executor_pb2_grpc.ExecutorServiceStub(channel).Connect()
        self.assignments: list[executor_pb2.Assignment] = []
        self._reader: asyncio.Task[None] | None = None

    async def open(self, slots: int) -> None:
        declared = [
            executor_pb2.ToolDeclaration(name=t, version="1", schema_sha256="0" * 64)
            for t in self.tools
        ]
        hello = executor_pb2.Hello(executor_id=self.name, capacity=slots, tools=declared)
        await self._call.write(executor_pb2.ConnectRequest(hello=hello))
        msg = await self._call.read()
        assert msg.HasField("welcome"), msg
        await self._call.write(executor_pb2.ConnectRequest(ready=executor_pb2.Ready(slots=slots)))
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self._call:
            if msg.HasField("assignment"):
                self.assignments.append(msg.assignment)

    async def close(self) -> None:
        self._call.cancel()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)


@pytest.fixture
async def executors(server, db_url) -> AsyncIterator[Any]:
    key = await auth.executor_key(db_url)
    opened: list[RawExecutor] = []
    async with auth.channel(f"127.0.0.1:{server.port}", key) as channel:

        async def connect(name: str, tools: Sequence[str], slots: int = 2) -> RawExecutor:
            ex = RawExecutor(channel, name, tools)
            await ex.open(slots)
            opened.append(ex)
            return ex

        yield connect
        for ex in opened:
            await ex.close()


async def publish(
    api: Api, agent_id: str, tools: Sequence[str], acknowledge: bool = False, **spec: Any
) -> agent_pb2.PublishAgentVersionResponse:
    try:
        await api.agents.CreateAgent(
            agent_pb2.CreateAgentRequest(workspace_id=WS, agent_id=agent_id)
        )
    except grpc.aio.AioRpcError as err:
        assert err.code() == grpc.StatusCode.ALREADY_EXISTS
    request = agent_pb2.PublishAgentVersionRequest(
        workspace_id=WS,
        agent_id=agent_id,
        acknowledge_trifecta=acknowledge,
        spec=agent_pb2.AgentSpec(model="writer", tools=list(tools), **spec),
    )
    return await api.agents.PublishAgentVersion(request)


async def refused(api: Api, agent_id: str, tools: Sequence[str]) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await publish(api, agent_id, tools)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    return info.value.details() or ""


async def live_executors(db) -> list[str]:
    return [r["executor_id"] for r in await db.fetch("SELECT executor_id FROM executor_tools")]


# --- no executor connected: the platform catalogue decides ------------------------------------


async def test_an_unknown_tool_is_refused_naming_it_and_nothing_is_written(api, db):
    details = await refused(api, "triage", ["send_email", "forward_invoices"])
    assert details == "spec.tools[1]: unknown tool 'forward_invoices'"
    assert await db.fetchval("SELECT count(*) FROM agent_versions") == 0


async def test_with_no_executor_connected_catalogue_tools_publish_with_a_warning(api):
    resp = await publish(api, "triage", ["echo"])
    assert resp.version.version == 1
    assert [(w.code, list(w.tools)) for w in resp.warnings] == [("no_executor", ["echo"])]
    assert "no executor serving this workspace is connected" in resp.warnings[0].message
    assert list((await publish(api, "quiet", [])).warnings) == []  # no tools, nothing to run


# --- connected executors decide ----------------------------------------------------------------


async def test_a_tool_no_connected_pool_carries_is_refused(api, executors, db):
    await executors("ex-echo", ["echo", "sleep"])
    await eventually(lambda: live_executors(db), message="the Hello was recorded")
    details = await refused(api, "mailer", ["echo", "send_email"])
    assert details.startswith("spec.tools[1]: 'send_email': no connected executor pool can run it")
    assert "they carry: echo, sleep" in details
    assert await refused(api, "x", ["nonsense"]) == "spec.tools[0]: unknown tool 'nonsense'"
    resp = await publish(api, "echoer", ["echo"])
    assert list(resp.warnings) == []  # a connected pool carries it
    assert await db.fetchval("SELECT count(*) FROM agent_versions") == 1


async def test_a_set_no_single_executor_carries_is_refused(api, executors, db):
    await executors("ex-echo", ["echo"])
    await executors("ex-mail", ["send_email"])
    await eventually(lambda: _count(db, 2), message="both Hellos were recorded")
    details = await refused(api, "both", ["echo", "send_email"])
    assert details.startswith("spec.tools: no connected executor carries all of echo, send_email")


async def _count(db, n: int) -> bool:
    return len(await live_executors(db)) == n


async def test_a_disconnected_executor_stops_counting(api, executors, db):
    ex = await executors("ex-echo", ["echo"])
    await eventually(lambda: _count(db, 1))
    await ex.close()
    await eventually(lambda: _count(db, 0), message="the stream's end forgot its tools")
    resp = await publish(api, "mailer", ["send_email"])  # the catalogue decides again
    assert [w.code for w in resp.warnings] == ["no_executor"]


async def test_an_executor_scoped_to_another_workspace_does_not_count(server, api, db_url, db):
    key = await auth.executor_key(db_url, scope=["elsewhere"])
    async with auth.channel(f"127.0.0.1:{server.port}", key) as channel:
        ex = RawExecutor(channel, "ex-elsewhere", ["echo"])
        await ex.open(1)
        await eventually(lambda: _count(db, 1))
        resp = await publish(api, "mailer", ["send_email"])
        assert [w.code for w in resp.warnings] == ["no_executor"]
        await ex.close()


# --- assignment: only to executors carrying every tool ----------------------------------------


async def test_runs_go_only_to_executors_carrying_all_their_tools(api, executors, db):
    await publish(api, "echoer", ["echo"])
    await publish(api, "mailer", ["send_email", "echo"])
    narrow = await executors("ex-narrow", ["echo"], slots=2)
    echo_run = await api.start("echoer", "hi")
    mail_run = await api.start("mailer", "hi")
    # One claim with two credits: unfiltered, it would have taken both runs.
    await eventually(lambda: len(narrow.assignments) == 1, message="the echo run was assigned")
    assert narrow.assignments[0].run.run_id == echo_run
    row = await db.fetchrow(
        "SELECT status, lease_epoch FROM runs WHERE run_id = $1::uuid", mail_run
    )
    assert (row["status"], row["lease_epoch"]) == ("queued", 0)
    wide = await executors("ex-wide", ["echo", "send_email"], slots=1)
    await eventually(lambda: len(wide.assignments) == 1, message="the mail run was assigned")
    assert wide.assignments[0].run.run_id == mail_run
    assert wide.assignments[0].run.lease_epoch == 1  # never claimed by the narrow executor
    assert len(narrow.assignments) == 1


# --- the lethal trifecta -----------------------------------------------------------------------


async def test_publishing_a_trifecta_agent_returns_the_warning(api):
    resp = await publish(api, "triage", TRIFECTA)
    assert resp.version.version == 1  # published regardless
    trifecta = next(w for w in resp.warnings if w.code == "lethal_trifecta")
    assert list(trifecta.tools) == ["send_email"]
    for words in (
        "private data (read_thread, crm_lookup)",
        "untrusted content (read_thread)",
        "external communication (send_email)",
        "Gate send_email behind approval",
    ):
        assert words in trifecta.message


async def test_an_external_sender_behind_approval_closes_the_trifecta(api):
    gated = approval_pb2.ApprovalPolicy(tools=["send_email"], approvers=["ops@acme.test"])
    resp = await publish(api, "triage", TRIFECTA, approval=gated)
    assert [w.code for w in resp.warnings] == ["no_executor"]
    two_legs = await publish(api, "reader", ["read_thread", "crm_lookup"])
    assert "lethal_trifecta" not in [w.code for w in two_legs.warnings]


async def test_the_cli_prints_the_trifecta_warning(server, api, db_url):
    await api.agents.CreateAgent(agent_pb2.CreateAgentRequest(workspace_id=WS, agent_id="triage"))
    tools = [arg for name in TRIFECTA for arg in ("--tool", name)]
    argv = [
        sys.executable,
        "-m",
        "agentrun_cli",
        "--address",
        f"127.0.0.1:{server.port}",
        "--workspace",
        WS,
        "agents",
        "publish",
        "triage",
        "--model",
        "writer",
        "--instructions",
        "triage leads",
        *tools,
    ]
    env = {**os.environ, "AGENTRUN_API_KEY": await auth.workspace_key(db_url, WS)}
    done = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    assert "published triage v1" in done.stdout
    assert "warning [lethal_trifecta]: these tools hold the lethal trifecta" in done.stderr
    assert "Gate send_email behind approval" in done.stderr


async def test_where_policy_asks_a_trifecta_publishes_only_when_acknowledged(db_url, db):
    config = ServerConfig(database_url=db_url, listen="127.0.0.1:0", trifecta_policy="acknowledge")
    strict = await start_server(config)
    client = await Api.connect(f"127.0.0.1:{strict.port}", db_url, WS)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await publish(client, "triage", TRIFECTA)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (info.value.details() or "").startswith(
            "acknowledge_trifecta: is required to publish this set: these tools hold"
        )
        assert await db.fetchval("SELECT count(*) FROM agent_versions") == 0
        resp = await publish(client, "triage", TRIFECTA, acknowledge=True)
        assert "lethal_trifecta" in [w.code for w in resp.warnings]
        audit = await db.fetchval("SELECT detail FROM audit_log WHERE action = 'agent.published'")
        assert "lethal_trifecta" in audit and "acknowledged_trifecta" in audit
    finally:
        await client.close()
        await strict.stop(grace=0)
