"""The CLI's gRPC calls: one method per RPC, pages followed, WatchRun resumed after UNAVAILABLE.

The channel (key, TLS) and the watch's resumption are agentrun_client's; the CLI keeps raw
messages, which it prints as they are (`-o json`), and calls RPCs the client does not wrap.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from types import TracebackType

import grpc

from agentrun.v1 import agent_pb2, agent_pb2_grpc, run_pb2, run_pb2_grpc
from agentrun_cli import credentials
from agentrun_client.watch import RetryHook, RunWatch

__all__ = ["Client", "RetryHook", "RunWatch"]

UNARY_TIMEOUT = 30.0


class Client:
    """A workspace-scoped client of AgentService and RunService over one channel."""

    def __init__(
        self, address: str, workspace: str, timeout: float = UNARY_TIMEOUT, key: str | None = None
    ) -> None:
        """`key`: the API key to send; by default AGENTRUN_API_KEY or the dev stack's admin key."""
        self.address = address
        self.workspace = workspace
        self.timeout = timeout
        self._channel = credentials.channel(address, key or credentials.api_key())
        self.agents = agent_pb2_grpc.AgentServiceStub(self._channel)
        self.runs = run_pb2_grpc.RunServiceStub(self._channel)

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    @property
    def channel(self) -> grpc.Channel:
        """The channel, for stubs of other services (sessions, triggers)."""
        return self._channel

    # --- agents ------------------------------------------------------------

    def create_agent(self, agent_id: str, display_name: str = "") -> agent_pb2.Agent:
        req = agent_pb2.CreateAgentRequest(
            workspace_id=self.workspace, agent_id=agent_id, display_name=display_name
        )
        return self.agents.CreateAgent(req, timeout=self.timeout).agent

    def get_agent(self, agent_id: str) -> agent_pb2.Agent:
        req = agent_pb2.GetAgentRequest(workspace_id=self.workspace, agent_id=agent_id)
        return self.agents.GetAgent(req, timeout=self.timeout).agent

    def publish(self, agent_id: str, spec: agent_pb2.AgentSpec) -> agent_pb2.AgentVersion:
        return self.publish_version(agent_id, spec).version

    def publish_version(
        self, agent_id: str, spec: agent_pb2.AgentSpec, acknowledge_trifecta: bool = False
    ) -> agent_pb2.PublishAgentVersionResponse:
        """The published version and the warnings about it."""
        req = agent_pb2.PublishAgentVersionRequest(
            workspace_id=self.workspace,
            agent_id=agent_id,
            spec=spec,
            acknowledge_trifecta=acknowledge_trifecta,
        )
        return self.agents.PublishAgentVersion(req, timeout=self.timeout)

    def get_version(self, agent_id: str, version: int = 0) -> agent_pb2.AgentVersion:
        req = agent_pb2.GetAgentVersionRequest(
            workspace_id=self.workspace, agent_id=agent_id, version=version
        )
        return self.agents.GetAgentVersion(req, timeout=self.timeout).version

    # --- runs --------------------------------------------------------------

    def start_run(
        self,
        agent_id: str,
        text: str,
        version: int = 0,
        request_id: str = "",
        trigger_connection_id: str = "",
        priority: int = 0,
        tags: Sequence[str] = (),
        metadata_json: str = "",
    ) -> run_pb2.StartRunResponse:
        req = run_pb2.StartRunRequest(
            workspace_id=self.workspace,
            agent_id=agent_id,
            agent_version=version,
            input=text,
            request_id=request_id,
            trigger_connection_id=trigger_connection_id,
            priority=priority,
            tags=list(tags),
            metadata_json=metadata_json,
        )
        return self.runs.StartRun(req, timeout=self.timeout)

    def get_run(self, run_id: str) -> run_pb2.Run:
        req = run_pb2.GetRunRequest(workspace_id=self.workspace, run_id=run_id)
        return self.runs.GetRun(req, timeout=self.timeout).run

    def cancel_run(self, run_id: str, reason: str = "") -> run_pb2.Run:
        req = run_pb2.CancelRunRequest(workspace_id=self.workspace, run_id=run_id, reason=reason)
        return self.runs.CancelRun(req, timeout=self.timeout).run

    def bulk_cancel(
        self, run_filter: run_pb2.RunFilter, every: bool, dry_run: bool, reason: str = ""
    ) -> Iterator[run_pb2.BulkCancelRunsResponse]:
        """BulkCancelRuns: its progress, after the count and after each batch."""
        req = run_pb2.BulkCancelRunsRequest(
            workspace_id=self.workspace,
            filter=run_filter,
            all=every,
            dry_run=dry_run,
            reason=reason,
        )
        yield from self.runs.BulkCancelRuns(req)

    def bulk_rerun(
        self, run_filter: run_pb2.RunFilter, every: bool, dry_run: bool
    ) -> Iterator[run_pb2.BulkRerunRunsResponse]:
        """BulkRerunRuns: its progress, after the count and after each batch."""
        req = run_pb2.BulkRerunRunsRequest(
            workspace_id=self.workspace, filter=run_filter, all=every, dry_run=dry_run
        )
        yield from self.runs.BulkRerunRuns(req)

    def pause_run(self, run_id: str, paused: bool) -> run_pb2.Run:
        """PauseRun (paused) or ResumeRun."""
        if paused:
            req = run_pb2.PauseRunRequest(workspace_id=self.workspace, run_id=run_id)
            return self.runs.PauseRun(req, timeout=self.timeout).run
        again = run_pb2.ResumeRunRequest(workspace_id=self.workspace, run_id=run_id)
        return self.runs.ResumeRun(again, timeout=self.timeout).run

    def set_queue_paused(self, agent_id: str, paused: bool) -> run_pb2.SetQueuePausedResponse:
        req = run_pb2.SetQueuePausedRequest(
            workspace_id=self.workspace, agent_id=agent_id, paused=paused
        )
        return self.runs.SetQueuePaused(req, timeout=self.timeout)

    def resolve_unknown(
        self, run_id: str, seq: int, decision: str, decided_by: str, note: str = ""
    ) -> run_pb2.ResolveUnknownOutcomeResponse:
        """Decide an unknown tool outcome: happened, not_happened, retry or fail_run."""
        req = run_pb2.ResolveUnknownOutcomeRequest(
            workspace_id=self.workspace,
            run_id=run_id,
            seq=seq,
            decided_by=decided_by,
            note=note,
            decision=run_pb2.OutcomeDecision.Value(f"OUTCOME_DECISION_{decision.upper()}"),
        )
        return self.runs.ResolveUnknownOutcome(req, timeout=self.timeout)

    def signal_run(
        self, run_id: str, name: str, event_id: str, payload_json: str
    ) -> run_pb2.SignalRunResponse:
        """Send a named event to a run (idempotent by event id)."""
        req = run_pb2.SignalRunRequest(
            workspace_id=self.workspace,
            run_id=run_id,
            signal_name=name,
            event_id=event_id,
            payload_json=payload_json,
        )
        return self.runs.SignalRun(req, timeout=self.timeout)

    def list_agents(self) -> Iterator[agent_pb2.Agent]:
        """Every agent of the workspace, by id, following page tokens."""
        req = agent_pb2.ListAgentsRequest(workspace_id=self.workspace, page_size=500)
        while True:
            resp = self.agents.ListAgents(req, timeout=self.timeout)
            yield from resp.agents
            if not resp.next_page_token:
                return
            req.page_token = resp.next_page_token

    def list_runs(
        self,
        agent_id: str = "",
        status: int = 0,
        limit: int | None = None,
        since: datetime | None = None,
        search: str = "",
        waiting_longer_than: float | None = None,
        tag: str = "",
        metadata: str = "",
    ) -> Iterator[run_pb2.Run]:
        """Runs newest first, following page tokens until the last page or `limit`.

        `since`: created at or after it; `search`: text in the id, agent, input,
        output or error; `waiting_longer_than`: waiting for more than these seconds
        (all filtered by the server).
        """
        left = limit
        req = run_pb2.ListRunsRequest(
            workspace_id=self.workspace,
            agent_id=agent_id,
            status=status,
            search=search,
            tag=tag,
            metadata=metadata,
        )
        if since is not None:
            req.create_after.FromDatetime(since)
        if waiting_longer_than is not None:
            req.waiting_longer_than.FromTimedelta(timedelta(seconds=waiting_longer_than))
        while left is None or left > 0:
            req.page_size = min(left or 500, 500)
            resp = self.runs.ListRuns(req, timeout=self.timeout)
            yield from resp.runs[:left]
            left = None if left is None else left - len(resp.runs)
            if not resp.next_page_token:
                return
            req.page_token = resp.next_page_token

    def list_steps(self, run_id: str, from_seq: int = 0) -> Iterator[run_pb2.Step]:
        """The step log from `from_seq` to the last committed step."""
        req = run_pb2.ListRunStepsRequest(
            workspace_id=self.workspace, run_id=run_id, from_seq=from_seq
        )
        while True:
            resp = self.runs.ListRunSteps(req, timeout=self.timeout)
            yield from resp.steps
            # next_seq 0 means nothing more now; a non-advancing seq would loop forever.
            if not resp.steps or resp.next_seq <= req.from_seq:
                return
            req.from_seq = resp.next_seq

    def watch(
        self,
        run_id: str,
        from_seq: int = 0,
        timeout: float | None = None,
        on_retry: RetryHook | None = None,
    ) -> RunWatch:
        return RunWatch(self.runs, self.workspace, run_id, from_seq, timeout, on_retry)
