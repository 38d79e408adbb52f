"""The held run: what the run loop and its model and tool turns share while a run is held."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from agentrun.v1 import executor_pb2
from executor import payloads
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
    # Sends a fast-path run's model output on the stream (ConnectRequest.delta); None: never.
    deltas: Callable[[executor_pb2.ModelDelta], object] | None = None
    # The wait after the first time the run's task failed unexpectedly, doubled each time
    # after (RunLoop._crashed).
    crash_backoff: float = 5.0
