"""The held run: what the run loop and its model and tool turns share while a run is held."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from agentrun.v1 import agent_pb2, executor_pb2, run_pb2
from executor import limits, payloads, replay
from executor.lease import LeaseKeeper
from executor.models.base import ModelClient
from executor.models.retry import ModelRetry
from executor.stream import CommitReply
from executor.tools.catalogue import Catalogue
from executor.tools.credentials import Granted
from executor.tools.delivery import ToolDelivery
from telemetry import tracing

# The held run's log lines and spans keep the run loop's name whichever module writes them:
# log filters and trace views select them by it.
log = logging.getLogger("executor.run_loop")
_tracer = tracing.tracer("executor.run_loop")


class RunFenced(Exception):
    """The run is no longer ours: stop at once and write nothing more."""


class RunInvalid(Exception):
    """The control plane refused a commit as malformed: a bug, the run stops."""


class HandBack(Exception):
    """The run may not ask the model under this lease any more (its stream is gone, or a
    last-moment check held the request back): handed back, to be claimed afresh."""


class Committer(Protocol):
    async def commit(
        self, commit: executor_pb2.Commit, reply_within: float | None = None
    ) -> CommitReply: ...


def child_span(name: str, **options: Any) -> contextlib.AbstractContextManager[object]:
    """A child span, or nothing when this process exports no spans (tracing.on())."""
    if not tracing.on():
        return contextlib.nullcontext()
    return _tracer.start_as_current_span(name, **options)


@dataclasses.dataclass(frozen=True)
class RunDeps:
    """What every run loop shares with the worker."""

    committer: Committer
    leases: LeaseKeeper
    model: ModelClient
    delivery: ToolDelivery
    catalogue: Catalogue
    wall_clock: Callable[[], float] = time.time
    rng: random.Random = dataclasses.field(default_factory=random.Random)
    model_retry: ModelRetry = dataclasses.field(default_factory=ModelRetry)
    # Named in the chain marker of the mail runs send (executor/tools/chain.py); "" = unnamed.
    installation: str = ""
    # Large tool results go here as payloads (executor/payloads.py); None: kept inline.
    large_results: payloads.LargeResults | None = None
    # The most a Commit may weigh; a heavier one fails its run rather than reach the stream.
    max_commit_bytes: int = 4 * 1024 * 1024 - 1024
    # (lease, connection id) -> the connection's access token, asked right before a tool
    # call leaves (ExecutorService.GetConnectionToken); None: connections are not used.
    connection_token: Callable[[executor_pb2.Lease, str], Awaitable[Granted]] | None = None
    # Sends a run's model output on the stream as it is generated (ConnectRequest.delta),
    # for its watchers and its Durable Stream; None: never.
    deltas: Callable[[executor_pb2.ModelDelta], object] | None = None
    # Every model call streams its output (AGENTRUN_MODEL_STREAM); False: fast-path runs' only.
    stream_every_call: bool = True
    # The wait after the first time the run's task failed unexpectedly, doubled each time
    # after (RunLoop._crashed).
    crash_backoff: float = 5.0


class Loop(Protocol):
    """What the turns ask of the run loop (executor/run_loop.py): to commit steps under the
    lease, to end the hold, and the send guard every request passes first."""

    async def commit(
        self,
        new_steps: list[executor_pb2.NewStep],
        *,
        park: executor_pb2.Park | None = None,
        complete: executor_pb2.Complete | None = None,
        fail: executor_pb2.Fail | None = None,
        approval_request: executor_pb2.ApprovalRequest | None = None,
        model_calls: int = 0,
        tool_calls: int = 0,
        tokens: int = 0,
    ) -> None: ...

    async def park(self, reason: str, wake_after: float | None, note: str) -> str: ...

    async def hand_back(self, note: str, unsent_seq: int | None = None) -> str: ...

    async def fail(self, error: str) -> str: ...

    async def guard(self) -> None: ...


@dataclasses.dataclass(eq=False)
class HeldRun:
    """One run while this executor holds it. `entries` is its log as committed so far; only
    the loop's commit extends it. The turns read the rest and never change it."""

    run: run_pb2.Run
    spec: agent_pb2.AgentSpec
    lease: executor_pb2.Lease
    entries: list[replay.Entry]
    deps: RunDeps
    # The built-ins and the workspace's registry tools the version pinned (Assignment.tools).
    catalogue: Catalogue
    loop: Loop
    # The run's depth in a chain of agent-to-agent mail (executor/tools/chain.py).
    chain_depth: int
    # This hold's start, for the active-time limit.
    held_from: float
    # Set by a drain: the run is handed back at its next turn boundary (at its next step
    # boundary when forced).
    handoff: asyncio.Event
    # Values the workspace's earlier ok calls sent, by (tool, argument), for VALUE_ALLOWED
    # rules with or_seen_before (Assignment.seen_values).
    seen: Mapping[tuple[str, str], Sequence[str]] = dataclasses.field(default_factory=dict)

    @property
    def run_id(self) -> str:
        return self.lease.run_id

    def next_seq(self) -> int:
        return replay.next_seq(self.entries)

    def over_limit(self, entries: list[replay.Entry], action: replay.Action) -> str | None:
        """The failure message if doing `action` after `entries` would break a limit."""
        now = self.deps.wall_clock()
        used = replay.counters(entries)
        return limits.exceeded(self.run, used, action, now, now - self.held_from)

    def turn_seconds(self, model_default: float, tool_default: float) -> float:
        """How long one turn of this run may take: its model call's timeout plus its
        slowest tool's (the defaults where the version or the tool sets none). A drain
        gives its runs this long to reach a turn boundary (executor/worker.py)."""
        params = self.spec.model_parameters
        model = model_default
        if params.HasField("timeout") and params.timeout.ToNanoseconds() > 0:
            model = params.timeout.ToNanoseconds() / 1e9
        tools = [
            target.timeout_seconds or tool_default
            for tool in self.catalogue.tools.values()
            if (target := tool.http or tool.mcp) is not None
        ]
        return model + max(tools, default=tool_default)

    def between_turns(self) -> bool:
        """Nothing of a turn is in flight: the next thing to do is to ask the model (or to
        finish), so no decided call waits to start or to be resolved."""
        action = replay.next_action(self.entries, self.run.limits.repeat_limit)
        return isinstance(action, (replay.CallModel, replay.FinishCompleted))

    def carried_over(self) -> bool:
        """The lease came over a reconnect: it may commit, never send (executor/horizon.py)."""
        return self.deps.leases.carried_over(self.run_id)

    def lease_safe(self) -> bool:
        return self.deps.leases.is_safe(self.run_id)
