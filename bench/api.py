"""The gRPC calls benchmarks make to set up work: agents, versions and runs."""

from __future__ import annotations

import asyncio

import grpc

from agentrun.v1 import agent_pb2, agent_pb2_grpc, run_pb2, run_pb2_grpc

WORKSPACE = "bench"


def channel(port: int) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(f"127.0.0.1:{port}")


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
