"""The gRPC calls benchmarks make to set up work: agents, versions and runs, authenticated.

Every call to the control plane needs a key: `mint_keys(dsn)` creates the bench
workspace and issues its admin key and an all-workspaces executor credential
straight into the bench database (as `agentrun admin bootstrap` does), and
`channel(port, key)` sends the key as `authorization: Bearer` on every call.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import asyncpg
import grpc

from agentrun.v1 import agent_pb2, agent_pb2_grpc, run_pb2, run_pb2_grpc
from control_plane.auth.credentials import KeyRequest, issue
from control_plane.store import identity

WORKSPACE = "bench"


@dataclass(frozen=True)
class BenchKeys:
    admin: str  # an admin key of the bench workspace
    executor: str  # an executor credential serving every workspace

    def __repr__(self) -> str:  # never print the keys
        return "BenchKeys(...)"


async def mint_keys(dsn: str, workspace: str = WORKSPACE) -> BenchKeys:
    """Create `workspace` (team plan, if new) and issue its admin key and an executor key."""
    conn = await asyncpg.connect(dsn)
    try:
        await identity.create_workspace(conn, workspace, "team", None)
        admin = await issue(conn, KeyRequest("workspace", "bench", "bench", workspace, "admin"))
        executor = await issue(conn, KeyRequest("executor", "bench-executors", "bench"))
        return BenchKeys(admin.text, executor.text)
    finally:
        await conn.close()


class _Bearer:
    def __init__(self, key: str) -> None:
        self._pair = ("authorization", f"Bearer {key}")

    def _details(self, details: Any) -> Any:
        return details._replace(metadata=[*(details.metadata or ()), self._pair])


class _UnaryUnary(_Bearer, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _UnaryStream(_Bearer, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _StreamStream(_Bearer, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._details(details), requests)


def channel(port: int, key: str | None) -> grpc.aio.Channel:
    """A channel to 127.0.0.1:`port` sending `key` (None: no credential, for the baseline)."""
    # grpc.aio files each interceptor under the first call type it implements: one per type.
    interceptors = [_UnaryUnary(key), _UnaryStream(key), _StreamStream(key)] if key else None
    return grpc.aio.insecure_channel(f"127.0.0.1:{port}", interceptors=interceptors)


async def publish_agent(
    chan: grpc.aio.Channel, agent_id: str, model: str, tools: list[str]
) -> agent_pb2.AgentVersion:
    """Create the agent and publish its first version."""
    agents = agent_pb2_grpc.AgentServiceStub(chan)
    await agents.CreateAgent(
        agent_pb2.CreateAgentRequest(workspace_id=WORKSPACE, agent_id=agent_id)
    )
    spec = agent_pb2.AgentSpec(model=model, tools=tools, instructions="benchmark")
    reply = await agents.PublishAgentVersion(
        agent_pb2.PublishAgentVersionRequest(workspace_id=WORKSPACE, agent_id=agent_id, spec=spec)
    )
    return reply.version


async def start_run(chan: grpc.aio.Channel, agent_id: str, text: str) -> run_pb2.Run:
    runs = run_pb2_grpc.RunServiceStub(chan)
    reply = await runs.StartRun(
        run_pb2.StartRunRequest(workspace_id=WORKSPACE, agent_id=agent_id, input=text)
    )
    return reply.run


async def start_runs(chan: grpc.aio.Channel, agent_id: str, n: int, in_flight: int) -> None:
    """Start n runs, at most `in_flight` StartRun calls at a time."""
    gate = asyncio.Semaphore(in_flight)

    async def one(i: int) -> None:
        async with gate:
            await start_run(chan, agent_id, f"benchmark run {i}")

    await asyncio.gather(*(one(i) for i in range(n)))
