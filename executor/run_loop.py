"""Drives one held run: rebuild from the log, pick the next step, commit it, then act on it."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import faults
from agentrun.v1 import executor_pb2
from executor import limits, replay, steps
from executor.lease import LeaseKeeper
from executor.models.base import ModelClient, ModelRejected, ModelReply, ModelUnavailable
from executor.replay import CallModel, Done, FinishCompleted, ResolveUnknown, StartTool
from executor.stream import CommitReply
from executor.tools.catalogue import Catalogue, ToolCallRejected
from executor.tools.delivery import Outcome, ToolDelivery

log = logging.getLogger(__name__)

MODEL_BACKOFF_START = 1.0
MODEL_BACKOFF_CAP = 60.0
MAX_RETRY_AFTER = 3600.0
COMMIT_BACKOFF_START = 0.1
COMMIT_BACKOFF_CAP = 2.0


class RunFenced(Exception):
    """The run is no longer ours: stop at once and write nothing more."""


class RunInvalid(Exception):
    """The control plane refused a commit as malformed: a bug, the run stops."""


class Committer(Protocol):
    async def commit(
        self, commit: executor_pb2.Commit, reply_within: float | None = None
    ) -> CommitReply: ...


def model_backoff(parks: int, retry_after: float | None, rng: random.Random) -> float:
    """Seconds to park after the model provider failed `parks` times in a row already."""
    delay = min(MODEL_BACKOFF_CAP, MODEL_BACKOFF_START * 2**parks)
    delay = rng.uniform(delay / 2, delay)
    if retry_after is not None:
        delay = max(delay, min(retry_after, MAX_RETRY_AFTER))
    return round(delay, 3)


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


class RunLoop:
    """One run, from its assignment until it finishes, parks or is fenced.

    `run()` returns how it ended: completed, failed, parked, fenced, invalid
    or done (the log was already finished). A fenced run may also just be
    cancelled by the worker; either way it writes nothing more.
    """

    def __init__(self, assignment: executor_pb2.Assignment, deps: RunDeps) -> None:
        run = assignment.run
        self._run = run
        self.run_id = run.run_id
        self.spec = assignment.agent_version.spec
        self.lease = executor_pb2.Lease(
            workspace_id=run.workspace_id, run_id=run.run_id, epoch=run.lease_epoch
        )
        self.entries = replay.decode(assignment.steps)
        self._deps = deps
        self._handoff = asyncio.Event()
        self._handoff_now = asyncio.Event()

    def request_handoff(self) -> None:
        """Drain: hand the run back at its next step boundary."""
        self._handoff.set()

    def interrupt(self) -> None:
        """Drain deadline: also abandon an in-flight model call (nothing of it is committed)."""
        self._handoff.set()
        self._handoff_now.set()

    async def run(self) -> str:
        try:
            return await self._loop()
        except RunFenced as exc:
            log.warning("run %s fenced at epoch %d: %s", self.run_id, self.lease.epoch, exc)
            return "fenced"
        except RunInvalid as exc:
            log.error("run %s: commit refused as invalid: %s", self.run_id, exc)
            return "invalid"

    async def _loop(self) -> str:
        while True:
            action = replay.next_action(self.entries)
            if isinstance(action, Done):
                log.warning("run %s was assigned but its log is finished", self.run_id)
                return "done"
            if self._handoff.is_set() and not isinstance(action, FinishCompleted):
                return await self._park("handoff", 0.0, "executor draining: handed back")
            error = limits.exceeded(
                self._run, replay.counters(self.entries), action, self._deps.wall_clock()
            )
            if error:
                return await self._fail(error)
            ended = await self._act(action)
            if ended:
                return ended

    async def _act(self, action: replay.Action) -> str | None:
        if isinstance(action, CallModel):
            return await self._call_model()
        if isinstance(action, StartTool):
            return await self._start_tool(action)
        if isinstance(action, ResolveUnknown):
            return await self._resolve_unknown(action)
        if isinstance(action, FinishCompleted):
            return await self._complete(action.output)
        raise AssertionError(f"unexpected action {action!r}")

    # -- the model ----------------------------------------------------------

    async def _call_model(self) -> str | None:
        seq = replay.next_seq(self.entries)
        try:
            reply = await self._ask_model(seq)
        except ModelUnavailable as exc:
            parks = replay.trailing_parks(self.entries, "model")
            delay = model_backoff(parks, exc.retry_after, self._deps.rng)
            log.warning("run %s: model unavailable (%s); parking %.1fs", self.run_id, exc, delay)
            return await self._park("model", delay, exc.reason)
        except ModelRejected as exc:
            return await self._fail(exc.reason)
        if reply is None:  # interrupted by the drain deadline
            return await self._park("handoff", 0.0, "executor draining: model call abandoned")
        faults.point("executor.model.after_response")
        reply = dataclasses.replace(reply, tool_calls=steps.unique_call_ids(reply.tool_calls, seq))
        decision = steps.decision(seq, reply, self.spec.model)
        counts = {"model_calls": 1, "tokens": reply.usage.total}
        if reply.tool_calls:
            await self._commit([decision], **counts)
            faults.point("executor.decision.after_commit")
            return None
        # No tool calls: the answer is final; decision and finish land together.
        output = reply.content or ""
        finish = steps.finish_completed(seq + 1, output)
        await self._commit(
            [decision, finish], complete=executor_pb2.Complete(output=output), **counts
        )
        faults.point("executor.decision.after_commit")
        log.info("run %s completed", self.run_id)
        return "completed"

    async def _ask_model(self, seq: int) -> ModelReply | None:
        """The model's reply, or None if the drain deadline interrupted the call."""
        messages = replay.build_messages(self.entries, self.spec.instructions)
        tools = self._deps.catalogue.openai_tools(self.spec.tools)
        call = asyncio.ensure_future(
            self._deps.model.complete(self.spec.model, messages, tools, self.run_id, seq)
        )
        interrupted = asyncio.ensure_future(self._handoff_now.wait())
        try:
            await asyncio.wait({call, interrupted}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            interrupted.cancel()
            if not call.done():
                call.cancel()
        return call.result() if call.done() and not call.cancelled() else None

    # -- tools --------------------------------------------------------------

    async def _start_tool(self, action: StartTool) -> str | None:
        call = action.call
        seq = replay.next_seq(self.entries)
        try:
            tool = self._deps.catalogue.check_call(
                call.name, call.arguments, self.spec.tools, call.arguments_raw
            )
        except ToolCallRejected as exc:
            # Nothing is sent; the model reads why on its next turn.
            log.info("run %s: tool call %s rejected: %s", self.run_id, call.id, exc)
            outcome = Outcome("error", error=str(exc))
            await self._commit_result(seq, action.decision_seq, call.id, call.name, outcome)
            return None
        arguments: Mapping[str, Any] = call.arguments or {}
        started = steps.tool_started(
            seq, action.decision_seq, call.id, tool.name, arguments, self.run_id, tool.call_class
        )
        if tool.kind == "internal":
            return await self._start_internal(started, call.id, tool.name, arguments)
        await self._commit([started], tool_calls=1)
        faults.point("executor.tool.after_started_commit")
        outcome = await self._deps.delivery.send(
            tool, arguments, f"{self.run_id}:{seq}", self._guard
        )
        faults.point("executor.tool.after_response")
        await self._commit_result(seq + 1, seq, call.id, tool.name, outcome)
        faults.point("executor.tool.after_result_commit")
        return None

    async def _start_internal(
        self, started: executor_pb2.NewStep, call_id: str, name: str, arguments: Mapping[str, Any]
    ) -> str | None:
        if name != "sleep":
            outcome = Outcome("error", error=f"internal tool {name!r} is not supported")
            await self._commit_result(started.seq, started.ref_seq, call_id, name, outcome)
            return None
        seconds = float(arguments["seconds"])
        # Started and parked in one commit: the run lets go while it sleeps, and
        # the result is written when it wakes (see _resolve_unknown).
        park = steps.park(started.seq + 1, "sleep", seconds, f"sleep {seconds:g}s")
        await self._commit(
            [started, park], park=steps.park_transition("sleep", seconds), tool_calls=1
        )
        log.info("run %s parked: sleep %gs", self.run_id, seconds)
        return "parked"

    async def _resolve_unknown(self, action: ResolveUnknown) -> str | None:
        started = action.started
        payload = started.payload
        call_id, name = str(payload.get("call_id", "")), str(payload.get("tool", ""))
        arguments = payload.get("arguments") or {}
        seq = replay.next_seq(self.entries)
        if action.call_class == "internal":
            # The sleep's wake time has passed: that is its result.
            outcome = Outcome("ok", output={"slept_seconds": arguments.get("seconds")})
        else:
            outcome = await self._resend(action, name, arguments)
        log.info(
            "run %s: unknown outcome of %s (%s) resolved: %s %s",
            self.run_id,
            name,
            action.call_class,
            outcome.status,
            outcome.resolution or "",
        )
        await self._commit_result(seq, started.seq, call_id, name, outcome)
        faults.point("executor.tool.after_result_commit")
        return None

    async def _resend(self, action: ResolveUnknown, name: str, arguments: Any) -> Outcome:
        tool = self._deps.catalogue.get(name)
        if tool is None:
            return Outcome(
                "unknown", resolution="not retried: the tool is no longer in the catalogue"
            )
        key = str(
            action.started.payload.get("idempotency_key") or f"{self.run_id}:{action.started.seq}"
        )
        recorded_class = action.call_class
        outcome = await self._deps.delivery.resolve_unknown(
            tool, recorded_class, arguments, key, self._guard
        )
        if outcome.resolution is None:  # it was sent again and answered
            faults.point("executor.tool.after_response")
        return outcome

    def _guard(self) -> None:
        """Self-fencing: never send a request under a lease that may lapse meanwhile."""
        if not self._deps.leases.is_safe(self.run_id):
            raise RunFenced("lease too close to expiry to send a tool request")

    # -- commits ------------------------------------------------------------

    async def _commit_result(
        self, seq: int, ref_seq: int, call_id: str, tool: str, outcome: Outcome
    ) -> None:
        step = steps.tool_result(
            seq,
            ref_seq,
            call_id,
            tool,
            outcome.status,
            output=outcome.output,
            error=outcome.error,
            resolution=outcome.resolution,
        )
        await self._commit([step])

    async def _complete(self, output: str) -> str:
        seq = replay.next_seq(self.entries)
        finish = steps.finish_completed(seq, output)
        await self._commit([finish], complete=executor_pb2.Complete(output=output))
        log.info("run %s completed", self.run_id)
        return "completed"

    async def _fail(self, error: str) -> str:
        finish = steps.finish_failed(replay.next_seq(self.entries), error)
        await self._commit([finish], fail=executor_pb2.Fail(error=error))
        log.info("run %s failed: %s", self.run_id, error)
        return "failed"

    async def _park(self, reason: str, wake_after: float, note: str) -> str:
        park = steps.park(replay.next_seq(self.entries), reason, wake_after, note)
        await self._commit([park], park=steps.park_transition(reason, wake_after))
        log.info("run %s parked (%s, wake after %.1fs)", self.run_id, reason, wake_after)
        return "parked"

    async def _commit(
        self,
        new_steps: list[executor_pb2.NewStep],
        *,
        park: executor_pb2.Park | None = None,
        complete: executor_pb2.Complete | None = None,
        fail: executor_pb2.Fail | None = None,
        model_calls: int = 0,
        tool_calls: int = 0,
        tokens: int = 0,
    ) -> None:
        """Commit steps (and a transition) under this lease; return only once they landed."""
        message = executor_pb2.Commit(
            lease=self.lease,
            steps=new_steps,
            park=park,
            complete=complete,
            fail=fail,
            model_calls=model_calls,
            tool_calls=tool_calls,
            tokens=tokens,
        )
        delay = COMMIT_BACKOFF_START
        while True:
            reply = await self._deps.committer.commit(message, self._deps.leases.lease_duration)
            if self._accepted(reply):
                break
            # UNAVAILABLE: the database was unreachable; the very same commit may
            # be sent again (idempotent by run, epoch and seq) while the lease lasts.
            if not self._deps.leases.is_safe(self.run_id):
                raise RunFenced("lease would lapse while the control plane cannot commit")
            await asyncio.sleep(self._deps.rng.uniform(delay / 2, delay))
            delay = min(COMMIT_BACKOFF_CAP, delay * 2)
        self._deps.leases.renew(self.run_id, self.lease.epoch, reply.sent_at)
        self.entries.extend(steps.as_entry(step) for step in new_steps)
        if log.isEnabledFor(logging.DEBUG):
            kinds = ", ".join(replay.kind_name(step.kind) for step in new_steps)
            log.debug("run %s committed %s", self.run_id, kinds)

    def _accepted(self, reply: CommitReply) -> bool:
        outcome = reply.result.outcome
        if outcome == executor_pb2.COMMIT_OUTCOME_OK:
            return True
        if outcome == executor_pb2.COMMIT_OUTCOME_FENCED:
            raise RunFenced(reply.result.message or "commit refused: the lease is lost")
        if outcome == executor_pb2.COMMIT_OUTCOME_INVALID:
            raise RunInvalid(reply.result.message)
        return False
