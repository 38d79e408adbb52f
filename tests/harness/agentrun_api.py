"""A small gRPC client for tests: publish agents, start runs, wait, read logs."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import httpx

from agentrun.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    approval_pb2,
    approval_pb2_grpc,
    run_pb2,
    run_pb2_grpc,
)
from tests.harness import auth
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
    """RunService and AgentService stubs over one channel, calling with `key`.

    Mint the key with tests.harness.auth: `Api(addr, "ws", await workspace_key(db_url, "ws"))`.
    """

    def __init__(
        self,
        address: str,
        workspace: str = "ws",
        key: str | None = None,
        db_url: str = "",
        tls: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.channel_target = address
        self.channel = auth.channel(address, key, tls)
        self.runs = run_pb2_grpc.RunServiceStub(self.channel)
        self.agents = agent_pb2_grpc.AgentServiceStub(self.channel)
        self.ws = workspace
        self.db_url = db_url  # where AutoApprover mints its approver's key

    @classmethod
    async def connect(
        cls, address: str, db_url: str, workspace: str = "ws", role: str = "admin"
    ) -> Api:
        """An Api calling with a new `role` key of `workspace` (created if new)."""
        key = await auth.workspace_key(db_url, workspace, role=role)
        return cls(address, workspace, key, db_url)

    async def close(self) -> None:
        await self.channel.close()

    async def publish(
        self,
        agent_id: str,
        model: str,
        tools: list[str],
        approval: approval_pb2.ApprovalPolicy | None = None,
        **limits: Any,
    ) -> int:
        try:
            await self.agents.CreateAgent(
                agent_pb2.CreateAgentRequest(workspace_id=self.ws, agent_id=agent_id)
            )
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.ALREADY_EXISTS:
                raise
        spec = agent_pb2.AgentSpec(
            model=model,
            instructions="test agent",
            tools=tools,
            limits=agent_pb2.RunLimits(**limits),
            approval=approval,
        )
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
                )
                for s in resp.steps
            ]
            if not resp.next_seq:
                return out
            seq = resp.next_seq

    async def wait_terminal(self, run_ids: list[str], within: float = 60) -> list[run_pb2.Run]:
        async def all_done() -> list[run_pb2.Run] | None:
            got = [await self.get(r) for r in run_ids]
            return got if all(r.status in TERMINAL for r in got) else None

        return await eventually(
            all_done, timeout=within, interval=0.2, message=f"runs did not finish in {within}s"
        )

    async def resolve_unknown(
        self, run_id: str, seq: int, decision: str, decided_by: str = "tester", note: str = ""
    ) -> run_pb2.ResolveUnknownOutcomeResponse:
        """Decide an unknown outcome; `decision` is happened, not_happened, retry or fail_run."""
        value = run_pb2.OutcomeDecision.Value(f"OUTCOME_DECISION_{decision.upper()}")
        return await self.runs.ResolveUnknownOutcome(
            run_pb2.ResolveUnknownOutcomeRequest(
                workspace_id=self.ws,
                run_id=run_id,
                seq=seq,
                decision=value,
                decided_by=decided_by,
                note=note,
            )
        )

    async def awaiting_person(self, run_id: str) -> LoggedStep | None:
        """The unknown outcome a run waits on a person for, found through the API, if any."""
        run = await self.get(run_id)
        if run.status != run_pb2.RUN_STATUS_WAITING or run.wait_reason != "human":
            return None
        steps = await self.steps(run_id)
        decided = {s.ref_seq for s in steps if s.kind == "tool_result" and "decision" in s.payload}
        pending = [
            s
            for s in steps
            if s.kind == "tool_result"
            and s.payload.get("awaiting") == "human"
            and s.seq not in decided
        ]
        return pending[-1] if pending else None


def sandbox_requests(url: str) -> list[dict[str, Any]]:
    resp = httpx.get(f"{url}/_sandbox/requests", timeout=10)
    resp.raise_for_status()
    return resp.json()["requests"]


async def pending_approval(
    api: Api, approvals: Any, run_id: str, approver: str
) -> approval_pb2.Approval:
    """The pending approval `run_id` waits on, once the run waits for one. `approvals` is
    anything with ApprovalService's ListApprovals (called as the approver would)."""

    async def one() -> approval_pb2.Approval | None:
        run = await api.get(run_id)
        if run.status != run_pb2.RUN_STATUS_WAITING or run.wait_reason != "approval":
            return None
        resp = await approvals.ListApprovals(
            approval_pb2.ListApprovalsRequest(
                workspace_id=api.ws, approver=approver, state=approval_pb2.APPROVAL_STATE_PENDING
            )
        )
        mine = [a for a in resp.approvals if a.run_id == run_id]
        return mine[0] if mine else None

    return await eventually(one, timeout=30, message="the run never waited for an approval")


def sent_mail(providers_url: str, run_id: str) -> list[dict[str, Any]]:
    """The mail the provider sandbox was asked to send for `run_id` (by its idempotency key)."""
    return [
        r
        for r in sandbox_requests(providers_url)
        if r["path"] == "/mail/send" and (r["idempotency_key"] or "").startswith(run_id)
    ]


def sandbox_effects(url: str, provider: str | None = None) -> list[dict[str, Any]]:
    """Side effects the provider sandbox performed (each with its request's key)."""
    params = {"provider": provider} if provider else {}
    resp = httpx.get(f"{url}/_sandbox/effects", params=params, timeout=10)
    resp.raise_for_status()
    return resp.json()["effects"]


def set_fault(url: str, **fault: Any) -> None:
    httpx.post(f"{url}/_sandbox/faults", json=fault, timeout=10).raise_for_status()


def clear_faults(url: str) -> None:
    """Disarm a sandbox's faults, keeping its request log."""
    httpx.delete(f"{url}/_sandbox/faults", timeout=10).raise_for_status()


class AutoApprover:
    """A person who approves every pending approval of the workspace as soon as it appears.

    For tests whose subject is not approvals but whose tools need one (money-moving
    tools always do, and only a signed-in person decides those):
    `async with AutoApprover(api, metadata=await member_signed_in(...)): ...`
    (tests.harness.idp; the control plane started with AGENTRUN_OIDC_ISSUER).
    """

    def __init__(
        self,
        api: Api,
        approver: str = "admin",
        interval: float = 0.1,
        metadata: list[tuple[str, str]] | None = None,
        *,
        key: str | None = None,
    ) -> None:
        """`metadata`: a signed-in person's credential (money-moving tools need one);
        `key`: an approver key of the workspace; neither: the approver's own approver key."""
        self.api = api
        self.approver = approver
        # The approver's credential (money-moving tools need a signed-in person:
        # `tests.harness.idp.signed_in`); the decision is the credential's.
        self.metadata = metadata
        self.interval = interval
        # A credential of its own: never the admin key of `api.channel` as well (two
        # authorization headers); signed-in metadata goes over a channel without a key.
        own = key is not None or metadata is not None
        self._own = auth.channel(api.channel_target, key) if own else None
        self.stub = approval_pb2_grpc.ApprovalServiceStub(self._own or api.channel)
        self.approved = 0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> AutoApprover:
        if self._own is None and self.metadata is None and self.api.db_url:
            key = await auth.workspace_key(
                self.api.db_url, self.api.ws, role="approver", principal=self.approver
            )
            self._own = auth.channel(self.api.channel_target, key)
            self.stub = approval_pb2_grpc.ApprovalServiceStub(self._own)
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        if self._own is not None:
            await self._own.close()

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(grpc.aio.AioRpcError):  # a control plane restarting
                pending = await self.stub.ListApprovals(
                    approval_pb2.ListApprovalsRequest(
                        workspace_id=self.api.ws,
                        approver=self.approver,
                        state=approval_pb2.APPROVAL_STATE_PENDING,
                        page_size=500,
                    ),
                    metadata=self.metadata,
                )
                for a in pending.approvals:
                    with contextlib.suppress(grpc.aio.AioRpcError):  # lost a race: fine
                        await self.stub.DecideApproval(
                            approval_pb2.DecideApprovalRequest(
                                workspace_id=self.api.ws,
                                approval_id=a.approval_id,
                                approve=approval_pb2.Approve(),
                            ),
                            metadata=self.metadata,
                        )
                        self.approved += 1
            await asyncio.sleep(self.interval)  # a person's polling interval


@contextlib.asynccontextmanager
async def echo_stack(
    control_plane: Callable[..., Any], db_url: str, **env: str
) -> AsyncIterator[tuple[Any, Api]]:
    """A control plane started with `env` (the `control_plane` fixture's factory), an admin
    Api of workspace "ws", and the agent "echoer" (the sandbox model's `echo_input`, the
    `echo` tool) published: (control plane, api)."""
    cp = control_plane(db_url, **env)
    api = await Api.connect(cp.address, db_url)
    await api.publish("echoer", "echo_input", ["echo"])
    try:
        yield cp, api
    finally:
        await api.close()
