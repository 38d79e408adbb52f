"""A small gRPC client for tests: publish agents, start runs, wait, read logs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import grpc
import httpx

from agentrun.v1 import agent_pb2, agent_pb2_grpc, run_pb2, run_pb2_grpc
from tests.harness.waiting import eventually

TERMINAL = {run_pb2.RUN_STATUS_COMPLETED, run_pb2.RUN_STATUS_FAILED, run_pb2.RUN_STATUS_CANCELLED}


@dataclass
class LoggedStep:
    seq: int
    kind: str
    epoch: int
    ref_seq: int
    payload: dict[str, Any]


class Api:
    """RunService and AgentService stubs over one channel."""

    def __init__(self, address: str, workspace: str = "ws") -> None:
        self.channel = grpc.aio.insecure_channel(address)
        self.runs = run_pb2_grpc.RunServiceStub(self.channel)
        self.agents = agent_pb2_grpc.AgentServiceStub(self.channel)
        self.ws = workspace

    async def close(self) -> None:
        await self.channel.close()

    async def publish(self, agent_id: str, model: str, tools: list[str], **limits: Any) -> int:
        try:
            await self.agents.CreateAgent(
                agent_pb2.CreateAgentRequest(workspace_id=self.ws, agent_id=agent_id)
            )
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.ALREADY_EXISTS:
                raise
        spec = agent_pb2.AgentSpec(
            model=model, instructions="test agent", tools=tools,
            limits=agent_pb2.RunLimits(**limits),
        )  # fmt: skip
        resp = await self.agents.PublishAgentVersion(
            agent_pb2.PublishAgentVersionRequest(workspace_id=self.ws, agent_id=agent_id, spec=spec)
        )
        return resp.version.version

    async def start(self, agent_id: str, text: str = "Follow up with ada@example.com") -> str:
        resp = await self.runs.StartRun(
            run_pb2.StartRunRequest(workspace_id=self.ws, agent_id=agent_id, input=text)
        )
        return resp.run.run_id

    async def get(self, run_id: str) -> run_pb2.Run:
        resp = await self.runs.GetRun(run_pb2.GetRunRequest(workspace_id=self.ws, run_id=run_id))
        return resp.run

    async def steps(self, run_id: str) -> list[LoggedStep]:
        out: list[LoggedStep] = []
        seq = 0
        while True:
            resp = await self.runs.ListRunSteps(
                run_pb2.ListRunStepsRequest(workspace_id=self.ws, run_id=run_id, from_seq=seq)
            )
            out += [
                LoggedStep(
                    s.seq,
                    run_pb2.StepKind.Name(s.kind).removeprefix("STEP_KIND_").lower(),
                    s.epoch,
                    s.ref_seq,
                    json.loads(s.payload_json),
                )  # fmt: skip
                for s in resp.steps
            ]
            if not resp.next_seq:
                return out
            seq = resp.next_seq

    async def wait_terminal(self, run_ids: list[str], within: float = 60) -> list[run_pb2.Run]:
        async def all_done() -> list[run_pb2.Run] | None:
            got = [await self.get(r) for r in run_ids]
            return got if all(r.status in TERMINAL for r in got) else None

        return await eventually(all_done, timeout=within, interval=0.2,
                                message=f"runs did not finish in {within}s")  # fmt: skip


def sandbox_requests(url: str) -> list[dict[str, Any]]:
    resp = httpx.get(f"{url}/_sandbox/requests", timeout=10)
    resp.raise_for_status()
    return resp.json()["requests"]


def set_fault(url: str, **fault: Any) -> None:
    httpx.post(f"{url}/_sandbox/faults", json=fault, timeout=10).raise_for_status()


def clear_faults(url: str) -> None:
    """Disarm a sandbox's faults, keeping its request log."""
    httpx.delete(f"{url}/_sandbox/faults", timeout=10).raise_for_status()
