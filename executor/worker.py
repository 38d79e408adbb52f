"""The executor process: slots, assignments, one task per held run, drain on SIGTERM."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from agentrun.v1 import executor_pb2
from executor import canary, metrics, steps
from executor.config import ExecutorConfig
from executor.lease import LeaseKeeper
from executor.models.base import ModelClient
from executor.models.openai import OpenAIChatModel
from executor.models.profiles import ModelRouter
from executor.models.retry import ModelRetry
from executor.payloads import LargeResults, Limits, PayloadClient
from executor.ratelimit.limiter import RateLimiter
from executor.ratelimit.tool_client import RateLimitedToolClient
from executor.run_loop import RunDeps, RunLoop
from executor.stream import CHANNEL_OPTIONS, ControlPlaneStream
from executor.tools.catalogue import Catalogue
from executor.tools.delivery import ToolDelivery

log = logging.getLogger(__name__)

# A forced drain: how long tool calls in flight get to return before their runs are
# abandoned to their leases.
FORCED_GRACE = 5.0
# A drain waiting for turns in progress says which, this often.
STILL_HOLDING_EVERY = 10.0


@dataclass
class _Held:
    loop: RunLoop
    task: asyncio.Task[str]


def declarations(catalogue: Catalogue) -> list[executor_pb2.ToolDeclaration]:
    """The tools this executor carries, as Hello declares them."""
    return [
        executor_pb2.ToolDeclaration(
            name=tool.name,
            version=tool.version,
            schema_sha256=tool.schema_sha256,
            capabilities=list(tool.capabilities),
        )
        for tool in catalogue.tools.values()
    ]


class Worker:
    """Holds up to `capacity` runs, asks for more as slots free, hands them back on drain."""

    def __init__(
        self,
        config: ExecutorConfig,
        *,
        model: ModelClient | None = None,
        catalogue: Catalogue | None = None,
    ) -> None:
        self._config = config
        # Every provider request takes a token first; a 429 parks the run.
        self._limiter = RateLimiter.from_config(config)
        self._tools = RateLimitedToolClient(config, self._limiter)
        self._own_model = model is None
        self._model: ModelClient = model or ModelRouter(
            OpenAIChatModel(
                config.model_base_url, config.model_api_key, config.model_timeout_seconds
            ),
            config.model_profiles,
            config.model_timeout_seconds,
            default_profile=config.model_default_profile,
        )
        self._stream = ControlPlaneStream(
            config.control_plane,
            self._hello,
            self,
            security=config.tls,
            credential=config.executor_key,
            ping_seconds=config.ping_seconds,
            dead_after=config.stream_dead_seconds,
        )
        self._leases = LeaseKeeper(
            self._stream.heartbeat, self._fence, horizon=self._stream.horizon
        )
        # Large results travel apart from the stream, on a channel of their own.
        self._payloads = PayloadClient(
            config.control_plane, CHANNEL_OPTIONS, config.tls, config.executor_key
        )
        self._deps = self._run_deps(config, catalogue or Catalogue.load())
        # Canary runs answer with the protocol marker in place of a model (executor/canary.py).
        self._canary_deps = dataclasses.replace(self._deps, model=canary.CanaryModel())
        self._runs: dict[str, _Held] = {}
        # Assignments asked for (Ready) and not received yet, this session.
        self._credits = 0
        # A top-up is due at the end of this turn of the event loop (_top_up_soon).
        self._top_up_due = False
        self._draining = False
        # Set by run(); a release drain (the control plane's Drain) sets it too.
        self._stop_event: asyncio.Event | None = None
        # A drain's explicit time to work on before handing back (None: none, hand back at
        # the next turn boundary).
        self._finish_within: float | None = None
        # Set by force(): hand back even a turn in progress.
        self._forced = asyncio.Event()

    def _run_deps(self, config: ExecutorConfig, catalogue: Catalogue) -> RunDeps:
        """What every run this executor drives shares."""
        limits = Limits(
            config.payload_threshold_bytes, config.payload_view_bytes, config.read_result_max_bytes
        )
        return RunDeps(
            committer=self._stream,
            leases=self._leases,
            model=self._model,
            delivery=ToolDelivery(self._tools),
            catalogue=catalogue,
            model_retry=ModelRetry(cap=config.model_backoff_cap_seconds),
            installation=config.installation,
            large_results=LargeResults(self._payloads, limits),
            connection_token=self._stream.connection_token,
            deltas=self._stream.delta,
            stream_every_call=config.model_stream,
            crash_backoff=config.crash_backoff_seconds,
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Work until `stop` is set, then drain and disconnect."""
        self._stop_event = stop
        self._stream.start()
        keeper = asyncio.create_task(self._leases.run(), name="heartbeat")
        try:
            await stop.wait()
            await self.drain()
        finally:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
            await self._stream.close(grace=1.0)
            await self._payloads.aclose()
            await self._tools.aclose()
            await self._limiter.aclose()
            log.info("rate limits: %s", self._limiter.metrics.summary())
            if self._own_model and isinstance(self._model, ModelRouter):
                await self._model.aclose()

    async def drain(self) -> None:
        """Stop asking for work and hand every held run back at its next turn boundary
        (executor/run_loop.py request_handoff): on no release, so the newest continues it.
        A drain's finish_within lets them work that long first. Past the longest turn held
        (AGENTRUN_DRAIN_SECONDS overrides it) a model call still in flight is abandoned
        (nothing of it is committed); a tool call in flight is waited for, however long,
        unless the drain is forced (force(): a second SIGTERM, or a forced Drain). Forced,
        runs are handed back at their next step boundary, turns in progress included (those
        wait for an executor of this release), and what is still held after FORCED_GRACE is
        abandoned to its lease."""
        self._draining = True
        # Credits granted earlier would bring handed-back runs straight back here.
        if self._stream.withdraw(self._credits):
            self._credits = 0
        clock = asyncio.get_running_loop().time
        if self._finish_within:
            log.info(
                "draining: %d runs held, working on them for %.1fs",
                len(self._runs),
                self._finish_within,
            )
            if await self._wait_runs(clock() + self._finish_within, until_forced=True):
                return
        budget = self._turn_budget()
        log.info(
            "draining: %d runs held, each handed back at its next turn boundary (%.1fs)",
            len(self._runs),
            budget,
        )
        for held in self._runs.values():
            held.loop.request_handoff()
        if await self._wait_runs(clock() + budget, until_forced=True):
            return
        for held in self._runs.values():
            held.loop.interrupt()
        while not self._forced.is_set():
            if await self._wait_runs(clock() + STILL_HOLDING_EVERY, until_forced=True):
                return
            if not self._forced.is_set():
                log.warning(
                    "draining: still holding %d turns in progress (%s); they are handed back "
                    "when their tool calls return (a second SIGTERM forces)",
                    len(self._runs),
                    ", ".join(sorted(self._runs)),
                )
        await self._drain_forced()

    async def _drain_forced(self) -> None:
        clock = asyncio.get_running_loop().time
        log.warning(
            "forced drain: handing back %d runs at their next step boundary; a turn in "
            "progress waits for an executor of release %s",
            len(self._runs),
            self._config.release,
        )
        for held in self._runs.values():
            held.loop.request_handoff(force=True)
            held.loop.interrupt()
        if await self._wait_runs(clock() + FORCED_GRACE):
            return
        for run_id, held in list(self._runs.items()):
            log.warning("run %s abandoned mid-step; its lease will lapse", run_id)
            held.task.cancel()
        await self._wait_runs(clock() + 0.5)

    def force(self) -> None:
        """Force the drain (a second SIGTERM, a forced Drain): see drain()."""
        if not self._forced.is_set():
            log.warning("drain forced: turns in progress are handed back too")
        self._forced.set()
        self._draining = True
        if self._stop_event is not None:
            self._stop_event.set()

    def _turn_budget(self) -> float:
        """How long the held runs get to reach a turn boundary (drain())."""
        if self._config.drain_seconds is not None:
            return self._config.drain_seconds
        model, tool = self._config.model_timeout_seconds, self._config.tool_timeout_seconds
        turns = [held.loop.turn_seconds(model, tool) for held in self._runs.values()]
        return max(turns, default=model + tool)

    async def _wait_runs(self, deadline: float, until_forced: bool = False) -> bool:
        """Wait until every held run ended (or the loop time `deadline`, or with
        `until_forced` a forced drain); True if none is left."""
        clock = asyncio.get_running_loop().time
        forced = asyncio.ensure_future(self._forced.wait()) if until_forced else None
        try:
            while self._runs and clock() < deadline:
                if forced is not None and forced.done():
                    break
                # Re-read the runs each time: an assignment may arrive while draining.
                tasks: list[asyncio.Future[Any]] = [held.task for held in self._runs.values()]
                if forced is not None:
                    tasks.append(forced)
                await asyncio.wait(
                    tasks, timeout=deadline - clock(), return_when=asyncio.FIRST_COMPLETED
                )
        finally:
            if forced is not None:
                forced.cancel()
        return not self._runs

    # -- StreamHandler ------------------------------------------------------

    def on_welcome(self, welcome: executor_pb2.Welcome) -> None:
        self._leases.configure(
            welcome.lease_duration.ToNanoseconds() / 1e9,
            welcome.heartbeat_interval.ToNanoseconds() / 1e9,
        )
        self._credits = 0  # a new session starts with no credit
        self._top_up()

    def on_assignment(self, assignment: executor_pb2.Assignment) -> None:
        run = assignment.run
        self._credits = max(0, self._credits - 1)
        current = self._runs.get(run.run_id)
        if current is not None:
            if current.loop.lease.epoch >= run.lease_epoch:
                log.warning("ignoring stale assignment of run %s", run.run_id)
                return
            self._stop(run.run_id, "reassigned at a newer epoch")
        is_canary = canary.is_canary(run.workspace_id)
        loop = RunLoop(assignment, self._canary_deps if is_canary else self._deps)
        interval = assignment.heartbeat_interval.ToNanoseconds() / 1e9  # fast path: 2 s
        self._leases.hold(loop.lease, interval if assignment.HasField("heartbeat_interval") else 0)
        if self._draining or len(self._runs) >= self._config.capacity:
            # More than we asked for: give it straight back (draining: once its turn is done).
            loop.request_handoff(force=self._forced.is_set() or not self._draining)
        task = asyncio.create_task(
            canary.run(loop.run()) if is_canary else loop.run(), name=f"run-{run.run_id}"
        )
        self._runs[run.run_id] = _Held(loop, task)
        metrics.ASSIGNMENTS.inc()
        metrics.RUNS_HELD.set(len(self._runs))
        task.add_done_callback(lambda t: self._finished(run.run_id, t))
        log.info(
            "claimed run %s of workspace %s (epoch %d, attempt %d, %d steps) on release %s",
            run.run_id,
            run.workspace_id,
            run.lease_epoch,
            run.attempt,
            len(assignment.steps),
            self._config.release,
        )

    def on_drain(self, drain: executor_pb2.Drain) -> None:
        """The release drains: claim nothing new, hand held runs back at their turn
        boundaries (drain()), then exit; a forced drain hands back turns in progress too
        (it may come first, or after a drain that was not forced)."""
        if not self._draining:
            if drain.HasField("finish_within"):
                self._finish_within = drain.finish_within.ToNanoseconds() / 1e9
            log.info(
                "release %s drains%s: handing held runs back at their turn boundaries, "
                "then exiting",
                drain.release,
                " (forced)" if drain.force else "",
            )
            self._draining = True
            if self._stream.withdraw(self._credits):
                self._credits = 0
            if self._stop_event is not None:
                self._stop_event.set()
        if drain.force:
            self.force()

    def on_cancel(self, cancel: executor_pb2.Cancel) -> None:
        held = self._runs.get(cancel.lease.run_id)
        if held is None:
            return
        if cancel.lease.epoch and cancel.lease.epoch < held.loop.lease.epoch:
            return  # about an earlier claim
        if cancel.pause:  # PauseRun: parked at its next step boundary, nothing in flight
            log.info("run %s paused: handing it back at its next step", cancel.lease.run_id)
            held.loop.request_handoff(force=True, note="paused: handed back")
            return
        self._leases.drop(cancel.lease.run_id)
        self._stop(cancel.lease.run_id, f"cancelled by the control plane: {cancel.reason}")

    # -- internals ----------------------------------------------------------

    def _hello(self) -> executor_pb2.Hello:
        return executor_pb2.Hello(
            executor_id=self._config.executor_id,
            release=self._config.release,
            continues=list(self._config.continues),
            capacity=self._config.capacity,
            held=self._leases.held(),
            tools=declarations(self._deps.catalogue),
            # A commit renews the lease only if its result says so (LeaseKeeper.committed).
            reads_commit_renewal=True,
            # A claim's runs for this stream may come in one message (Stream._assign_each),
            # and commit results several to a message.
            reads_batches=True,
            log_version=steps.LOG_VERSION,
            log_reads_from=steps.LOG_READS_FROM,
        )

    def _fence(self, run_id: str, reason: str) -> None:
        """The lease keeper lost this run's lease: stop it before it writes anything more."""
        self._stop(run_id, f"lease lost: {reason}")

    def _stop(self, run_id: str, reason: str) -> None:
        held = self._runs.get(run_id)
        if held is not None and not held.task.done():
            log.warning("run %s fenced: %s", run_id, reason)
            held.task.cancel()

    def _finished(self, run_id: str, task: asyncio.Task[str]) -> None:
        held = self._runs.get(run_id)
        if held is not None and held.task is task:
            del self._runs[run_id]
            self._leases.drop(run_id)
        if task.cancelled():
            how = "fenced"
        elif task.exception() is not None:
            how = "crashed"
            log.error("run %s crashed", run_id, exc_info=task.exception())
        else:
            how = task.result()
        metrics.RELEASED.labels(how).inc()
        if how == "fenced":
            metrics.FENCED.inc()
        metrics.RUNS_HELD.set(len(self._runs))
        log.info("run %s released: %s", run_id, how)
        self._top_up_soon()

    def _top_up_soon(self) -> None:
        """Top up at the end of this turn of the loop: the runs that end in one turn (their
        last commit results arrive together) free their slots with one Ready, one stream
        message for the control plane to read instead of one a run."""
        if not self._top_up_due:
            self._top_up_due = True
            asyncio.get_running_loop().call_soon(self._top_up_now)

    def _top_up_now(self) -> None:
        self._top_up_due = False
        self._top_up()

    def _top_up(self) -> None:
        """Ask for as many runs as there are free slots not already asked for."""
        if self._draining:
            return
        wanted = self._config.capacity - len(self._runs) - self._credits
        if wanted > 0 and self._stream.ready(wanted):
            self._credits += wanted
