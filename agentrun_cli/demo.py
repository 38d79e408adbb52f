"""The `agentrun dev --demo` scenario: publish a follow-up agent, run it to the end, show its log."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TextIO

import grpc

from agentrun.v1 import agent_pb2, approval_pb2, approval_pb2_grpc, run_pb2
from agentrun_cli import credentials, render
from agentrun_cli.client import Client
from agentrun_cli.supervisor import StackError, Supervisor

AGENT_ID = "demo-followup"
APPROVER = "manager@example.com"
SPEC = agent_pb2.AgentSpec(
    model="demo",
    # The sandbox plays the demo even when a provider key gives the other agents a real model.
    model_profile="sandbox-openai",
    tools=["crm_lookup", "send_email", "echo", "sleep"],
    instructions="You follow up with leads.",
    # Outbound mail is irreversible: a manager approves the exact message first.
    approval=approval_pb2.ApprovalPolicy(tools=["send_email"], approvers=[APPROVER]),
)
INPUT = "Follow up with ada@example.com"
TIMEOUT = 60.0


class DemoError(RuntimeError):
    """The demo run did not reach a terminal state."""


class Demo:
    """One demo run against a started stack, printed as it happens."""

    def __init__(
        self,
        client: Client,
        supervisor: Supervisor,
        out: TextIO = sys.stdout,
        approver_key: str | None = None,
    ) -> None:
        self.client = client
        self.supervisor = supervisor
        self.out = out
        self.approver_key = approver_key

    def run(self) -> int:
        """0 when the run completed, 1 otherwise."""
        version = self._publish()
        started = self.client.start_run(AGENT_ID, INPUT, version=version.version).run
        self._say(f"started run {started.run_id} ({AGENT_ID} v{version.version}): {INPUT!r}")
        final = self._follow(started.run_id)
        self._report(final)
        return 0 if final.status == run_pb2.RUN_STATUS_COMPLETED else 1

    def _publish(self) -> agent_pb2.AgentVersion:
        try:
            self.client.create_agent(AGENT_ID, "Demo: follow up with a lead")
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.ALREADY_EXISTS:
                raise
        version = self.client.publish(AGENT_ID, SPEC)
        self._say(f"published {AGENT_ID} v{version.version} (tools: {', '.join(SPEC.tools)})")
        return version

    def _follow(self, run_id: str) -> run_pb2.Run:
        """Print the run's steps and state changes until it is terminal (or TIMEOUT passes)."""
        watch = self.client.watch(run_id, timeout=TIMEOUT, on_retry=self._on_retry)
        # A child dying mid-run (executor crash) ends the watch at once instead of at TIMEOUT.
        self.supervisor.on_exit(lambda child: watch.cancel())
        try:
            for line in render.event_lines(self._states(watch)):
                self._say("  " + line)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                self._report(self.client.get_run(run_id))  # how far it got
                raise DemoError(f"run {run_id} not finished after {TIMEOUT:g}s") from None
            raise
        if self.supervisor.failure is not None:
            raise StackError(self.supervisor.failure.describe_exit())
        return self.client.get_run(run_id)

    def _states(
        self, events: Iterable[run_pb2.WatchRunResponse]
    ) -> Iterator[run_pb2.WatchRunResponse]:
        """Pass events through; on_state sees each state change once it is printed."""
        for event in events:
            yield event  # printed first, then acted on
            if event.HasField("run"):
                self.on_state(event.run)

    def on_state(self, run: run_pb2.Run) -> None:
        """Act on a state change the demo must answer (the seam for decisions it makes)."""
        if run.status == run_pb2.RUN_STATUS_WAITING and run.wait_reason == "approval":
            self.decide_approval(run)

    def decide_approval(self, run: run_pb2.Run) -> None:
        """Act as the manager: read the exact arguments, then approve through ApprovalService."""
        # The manager's own approver key, not the admin's.
        key = self.approver_key or credentials.api_key("approver")
        with credentials.channel(self.client.address, key) as channel:
            stub = approval_pb2_grpc.ApprovalServiceStub(channel)
            pending = stub.ListApprovals(
                approval_pb2.ListApprovalsRequest(
                    workspace_id=self.client.workspace,
                    approver=APPROVER,
                    state=approval_pb2.APPROVAL_STATE_PENDING,
                ),
                timeout=TIMEOUT,
            ).approvals
            for approval in (a for a in pending if a.run_id == run.run_id):
                self._say(
                    f"  approval {approval.approval_id}: {approval.tool} {approval.arguments_json}"
                )
                self._say(
                    f"  $ agentrun approvals approve {approval.approval_id} --approver {APPROVER}"
                )
                stub.DecideApproval(
                    approval_pb2.DecideApprovalRequest(
                        workspace_id=self.client.workspace,
                        approval_id=approval.approval_id,
                        approver=APPROVER,
                        approve=approval_pb2.Approve(),
                    ),
                    timeout=TIMEOUT,
                )

    def _report(self, run: run_pb2.Run) -> None:
        self._say("")
        for line in render.run_summary(run):
            self._say(line)
        self._say("")
        for line in render.step_table(self.client.list_steps(run.run_id)):
            self._say(line)

    def _on_retry(self, err: grpc.RpcError, delay: float) -> None:
        self._say(f"  (watch: {err.code().name}; reconnecting in {delay:.1f}s)")

    def _say(self, line: str) -> None:
        print(line, file=self.out, flush=True)


def run_demo(
    address: str, workspace: str, supervisor: Supervisor, data_dir: Path | None = None
) -> int:
    """Run the demo against the control plane at `address`; the exit status of `dev --demo`."""
    admin, approver = (credentials.api_key(r, data_dir) for r in ("admin", "approver"))
    with Client(address, workspace, key=admin) as client:
        return Demo(client, supervisor, approver_key=approver).run()
