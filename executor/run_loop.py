"""Drives one held run: rebuild from the log, pick the next step, commit it, then act on it."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import logging
import os
import random
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.trace import SpanKind

import faults
from agentrun.v1 import executor_pb2
from executor import (
    approval,
    constraints,
    context,
    horizon,
    limits,
    payloads,
    replay,
    signal_wait,
    steps,
    transcript,
    untrusted,
)
from executor import metrics as m
from executor.canary import TOOL as CANARY_TOOL
from executor.canary import tool_output as canary_output
from executor.held import HandBack, RunDeps, RunFenced, RunInvalid, child_span
from executor.horizon import SEND_GATE
from executor.lease import NOT_HELD
from executor.models import profiles
from executor.models.base import (
    ModelRejected,
    ModelReply,
    ModelSettings,
    ModelUnavailable,
)
from executor.ratelimit import parks as rate_parks
from executor.ratelimit.limiter import RateLimited
from executor.replay import (
    AwaitApproval,
    AwaitPerson,
    CallModel,
    Done,
    FailRun,
    FinishCompleted,
    HoldRepeat,
    RefuseCall,
    ResolveUnknown,
    StartTool,
)
from executor.stream import CommitReply, cancelling
from executor.tools import chain, credentials, definitions, keys
from executor.tools.catalogue import Tool, ToolCallRejected
from executor.tools.delivery import Outcome, after_parks, pending_backoff
from telemetry import logs, tracing
from telemetry.scrape import labelled

log = logging.getLogger(__name__)
_tracer = tracing.tracer(__name__)

MODEL_BACKOFF_START = 1.0
MODEL_BACKOFF_CAP = 60.0
MAX_RETRY_AFTER = 3600.0
COMMIT_BACKOFF_START = 0.1
COMMIT_BACKOFF_CAP = 2.0
# The internal tool that runs another agent, and the wait it parks the run in.
CHILD_TOOL = "start_child"
CHILD_WAIT = "child"
# A run whose task failed unexpectedly waits so (RunLoop._crashed), and fails the
# MAX_CRASHES-th time.
CRASH_WAIT = "executor_error"
MAX_CRASHES = 5
# A run handed back this many times in a row is claimed afresh at once; after that it waits
# 1, 2, 4 ... seconds (at most HANDOFF_WAIT_CAP) before each claim: a call our own side keeps
# refusing must not spin through claims.
HANDOFFS_AT_ONCE = 3
HANDOFF_WAIT_CAP = 60.0


def model_backoff(parks: int, retry_after: float | None, rng: random.Random) -> float:
    """Seconds to park after the model provider failed `parks` times in a row already."""
    delay = min(MODEL_BACKOFF_CAP, MODEL_BACKOFF_START * 2**parks)
    delay = rng.uniform(delay / 2, delay)
    if retry_after is not None:
        delay = max(delay, min(retry_after, MAX_RETRY_AFTER))
    return round(delay, 3)


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
        # The turns' rendered messages, kept across this run's model calls (transcript.py).
        self._rendered = transcript.RenderedTurns()
        self._chain_depth = chain.run_depth(assignment.steps)
        self._deps = deps
        # The built-ins and the workspace's registry tools the version pinned (Assignment.tools).
        self._catalogue = definitions.for_run(deps.catalogue, assignment.tools)
        self._held_from = deps.wall_clock()  # this hold's start, for the active-time limit
        self._handoff = asyncio.Event()
        self._handoff_now = asyncio.Event()
        self._model_call: asyncio.Task[ModelReply] | None = None  # in flight, for interrupt()
        self._tool_schemas: list[dict[str, Any]] | None = None  # _tools(), built on first use

    def request_handoff(self) -> None:
        """Drain: hand the run back at its next step boundary."""
        self._handoff.set()

    def interrupt(self) -> None:
        """Drain deadline: also abandon an in-flight model call (nothing of it is committed)."""
        self._handoff.set()
        self._handoff_now.set()
        if self._model_call is not None:
            self._model_call.cancel()

    async def run(self) -> str:
        """Drive the run; one span (and the log context) per hold, each commit a child."""
        run, lease = self._run, self.lease
        # The last-moment check right before a tool request leaves (executor/horizon.py).
        SEND_GATE.set(lambda: self._deps.leases.send_refusal(self.run_id))
        with (
            logs.bound(workspace=lease.workspace_id, run=lease.run_id, epoch=lease.epoch),
            tracing.run_trace(lease.run_id),
        ):
            if not tracing.on():  # no exporter: a no-op span would cost and record nothing
                return await self._run_held()
            attributes = {
                "agentrun.workspace": lease.workspace_id,
                "agentrun.run": lease.run_id,
                "agentrun.epoch": lease.epoch,
                "agentrun.attempt": run.attempt,
            }
            with _tracer.start_as_current_span("agentrun.run", attributes=attributes) as span:
                how = await self._run_held()
                span.set_attribute("agentrun.outcome", how)
                return how

    async def _run_held(self) -> str:
        try:
            return await self._loop()
        except (RunFenced, payloads.PayloadFenced) as exc:
            log.warning("run %s fenced at epoch %d: %s", self.run_id, self.lease.epoch, exc)
            return "fenced"
        except (RunInvalid, payloads.PayloadRefused) as exc:
            log.error("run %s: commit refused as invalid: %s", self.run_id, exc)
            return await self._fail_invalid(str(exc))
        except Exception as exc:  # noqa: BLE001 - a bug, or an answer nothing foresaw
            return await self._crashed(exc)

    async def _crashed(self, exc: Exception) -> str:
        """The run's task failed in a way nothing handles: a bug, or an answer no check
        foresaw. Left alone, its lease would lapse and every executor that took it over
        would fail the same way, unseen, until the run's deadline. Instead it parks
        (wait_reason "executor_error", the failure named in its park step), waiting longer
        each time; the MAX_CRASHES-th time it fails, naming the failure. Resuming is as
        after a takeover: the log says what was committed, and a tool call started without
        a result is resolved as after any crash. Only the exception's class and where it
        was raised are recorded (its message may quote a provider's answer)."""
        log.error("run %s: its task failed", self.run_id, exc_info=exc)
        where = _where(exc)
        crashes = 1 + sum(
            1
            for e in self.entries
            if e.kind == replay.PARK and e.payload.get("wait_reason") == CRASH_WAIT
        )
        try:
            if crashes >= MAX_CRASHES:
                return await self._fail(
                    f"executor error: the run's task failed {crashes} times, the last with "
                    f"{where}; it is not tried again"
                )
            wait = self._deps.crash_backoff * 2 ** (crashes - 1)
            note = f"the run's task failed ({crashes} of {MAX_CRASHES}) with {where}"
            return await self._park(CRASH_WAIT, wait, note)
        except (RunFenced, RunInvalid, payloads.PayloadFenced) as second:
            log.warning("run %s: could not record its failure: %s", self.run_id, second)
            return "crashed"

    async def _fail_invalid(self, reason: str) -> str:
        """A refused commit would be refused again after every takeover: fail the run
        (visibly, with the reason) instead of leaving it to be reclaimed forever."""
        try:
            return await self._fail(f"internal error: a commit was refused as invalid: {reason}")
        except (RunInvalid, RunFenced) as exc:
            log.error("run %s: could not fail it either: %s", self.run_id, exc)
            return "invalid"

    async def _loop(self) -> str:
        while True:
            action = replay.next_action(self.entries, self._run.limits.repeat_limit)
            if isinstance(action, Done):
                log.warning("run %s was assigned but its log is finished", self.run_id)
                return "done"
            if self._handoff.is_set() and not isinstance(action, FinishCompleted):
                return await self._hand_back("executor draining: handed back")
            if isinstance(action, (StartTool, ResolveUnknown)) and self._carried_over():
                note = "stream replaced since the lease was granted: handed back to send under a fresh one"
                return await self._hand_back(note, self._unsent_call(action))
            now = self._deps.wall_clock()
            error = limits.exceeded(
                self._run, replay.counters(self.entries), action, now, now - self._held_from
            )
            if error:
                return await self._fail(error)
            try:
                ended = await self._act(action)
            except HandBack as back:
                return await self._hand_back(str(back))
            if ended:
                return ended

    async def _act(self, action: replay.Action) -> str | None:
        if isinstance(action, CallModel):
            return await self._call_model()
        if isinstance(action, StartTool):
            return await self._start_tool(action)
        if isinstance(action, HoldRepeat):
            return await self._hold_repeat(action)
        if isinstance(action, ResolveUnknown):
            return await self._resolve_unknown(action)
        if isinstance(action, AwaitApproval):
            note = f"tool call {action.requested.payload.get('call_id')} still waits for approval"
            return await self._park("approval", None, note)
        if isinstance(action, RefuseCall):
            await self._refuse(action)
            return None
        if isinstance(action, AwaitPerson):
            return await self._await_person(action)
        if isinstance(action, FailRun):
            return await self._fail(action.error)
        return await self._finish(action)

    async def _finish(self, action: replay.Action) -> str:
        if isinstance(action, FinishCompleted):
            return await self._complete(action.output)
        raise AssertionError(f"unexpected action {action!r}")

    async def _await_person(self, action: AwaitPerson) -> str:
        """Still no decision (the run was woken or reassigned): park for it again."""
        if action.result.payload.get("held") == "repeat":
            note = f"the repeated call at step {action.result.seq} still waits for a person"
            return await self._park(steps.REPEAT_WAIT, None, note)
        note = f"the outcome of step {action.result.seq} still waits for a person's decision"
        return await self._park("human", None, note)

    async def _hold_repeat(self, action: HoldRepeat) -> str:
        """Not started: the repeat is recorded as held and the run waits for a person
        (the control plane notifies them through the outbox)."""
        held = steps.repeat_hold(replay.next_seq(self.entries), action)
        await self._commit(held, park=steps.park_transition(steps.REPEAT_WAIT, None))
        log.warning(
            "run %s: %s repeated %d times; parked for a person",
            self.run_id,
            action.call.name,
            action.count,
        )
        return "parked"

    # -- the model ----------------------------------------------------------

    async def _call_model(self) -> str | None:
        if ended := await self._summarise():
            return ended
        seq = replay.next_seq(self.entries)
        messages = transcript.build_messages(self.entries, self.spec.instructions, self._rendered)
        try:
            with child_span("agentrun.model", attributes={"agentrun.seq": seq}):
                reply = await self._ask_model(seq, messages, self._tools(), self._streamed(seq))
        except ModelUnavailable as exc:
            m.MODEL_CALLS.labels("unavailable").inc()
            return await self._model_unavailable(exc)
        except ModelRejected as exc:
            m.MODEL_CALLS.labels("rejected").inc()
            return await self._fail(exc.reason)
        labelled(m.MODEL_CALLS, "ok").inc()
        if reply is None:  # interrupted by the drain deadline
            return await self._hand_back("executor draining: model call abandoned")
        faults.point("executor.model.after_response")
        reply = dataclasses.replace(reply, tool_calls=steps.unique_call_ids(reply.tool_calls, seq))
        decision = steps.decision(seq, reply, self.spec.model)
        counts = {"model_calls": 1, "tokens": reply.usage.total}
        if error := steps.failed_reply(reply, self._settings):
            # No answer to act on (cut off, filtered, refused): recorded, and the run fails.
            finish = steps.finish_failed(seq + 1, error)
            await self._commit([decision, finish], fail=executor_pb2.Fail(error=error), **counts)
            log.info("run %s failed: %s", self.run_id, error)
            return "failed"
        if reply.tool_calls:
            return await self._commit_decision(decision, counts)
        # No tool calls: the answer is final; decision and finish land together.
        output = reply.content or ""
        finish = steps.finish_completed(seq + 1, output)
        await self._commit(
            [decision, finish], complete=executor_pb2.Complete(output=output), **counts
        )
        faults.point("executor.decision.after_commit")
        log.info("run %s completed", self.run_id)
        return "completed"

    async def _commit_decision(
        self, decision: executor_pb2.NewStep, counts: dict[str, int]
    ) -> str | None:
        """Commit a decision that calls tools. When its first call would be started right
        away (what the loop would do next, checked the same way), the call's `tool_started`
        lands in the same commit: both are recorded before any request leaves, one round
        trip fewer. A crash after it resumes as after any started call (resolved by class)."""
        ahead = self._start_ahead(decision)
        if ahead is None:
            await self._commit([decision], **counts)
            faults.point("executor.decision.after_commit")
            return None
        tool, started, call_id, arguments = ahead
        await self._commit([decision, started], tool_calls=1, **counts)
        faults.point("executor.decision.after_commit")
        faults.point("executor.tool.after_started_commit")
        return await self._send(tool, started, call_id, arguments)

    def _start_ahead(
        self, decision: executor_pb2.NewStep
    ) -> tuple[Tool, executor_pb2.NewStep, str, Mapping[str, Any]] | None:
        """The tool and `tool_started` step of the decision's first call if the loop's next
        step would be to start it and send it (no handoff, limit, refusal, approval or
        internal tool in the way); else None, and the decision is committed alone."""
        if self._handoff.is_set() or self._carried_over():
            return None
        entries = [*self.entries, steps.as_entry(decision)]
        action = replay.next_action(entries, self._run.limits.repeat_limit)
        if not isinstance(action, StartTool) or action.approval is not None:
            return None
        now = self._deps.wall_clock()
        used = replay.counters(entries)
        if limits.exceeded(self._run, used, action, now, now - self._held_from):
            return None
        checked = self._check(action, decision.seq + 1)
        if isinstance(checked, executor_pb2.NewStep):
            return None
        tool, verdict = checked
        if tool.provider == "internal" or verdict.approval is not None:
            return None
        if approval.needs_approval(tool, self.spec):
            return None
        call, arguments = action.call, action.call.arguments or {}
        started = steps.tool_started(
            decision.seq + 1,
            decision.seq,
            call.id,
            tool.name,
            arguments,
            self.run_id,
            tool.call_class,
        )
        if decision.ByteSize() + started.ByteSize() + 4096 > self._deps.max_commit_bytes:
            return None  # each fits alone: two commits rather than one refused
        return tool, started, call.id, arguments

    async def _model_unavailable(self, exc: ModelUnavailable) -> str:
        """Park with backoff while the provider is down; fail once the run's budget is spent."""
        retry = self._deps.model_retry
        parks = replay.trailing_parks(self.entries, "model")
        budget = retry.budget(self._run.limits.model_retry_budget)
        if parks >= budget:
            return await self._fail(retry.give_up(budget, exc.reason))
        delay = retry.delay(parks, exc.retry_after, self._deps.rng)
        log.warning("run %s: model unavailable (%s); parking %.1fs", self.run_id, exc, delay)
        return await self._park("model", delay, exc.reason)

    async def _summarise(self) -> str | None:
        """Past the run's context threshold, first recap the older steps as a step of its
        own (executor/context.py); returns how the run ended if asking for it ended it."""
        tools, instructions = self._tools(), self.spec.instructions
        span = context.plan(
            self.entries, instructions, tools, self._run.limits.context_tokens, self._rendered
        )
        if span is None:
            return None
        seq = replay.next_seq(self.entries)
        try:
            reply = await self._ask_model(
                seq, context.request_messages(self.entries, instructions, span), tools
            )
        except ModelUnavailable as exc:
            return await self._model_unavailable(exc)
        except ModelRejected as exc:
            return await self._fail(f"asked to summarise the run, the model refused: {exc.reason}")
        if reply is None:  # interrupted by the drain deadline
            return await self._hand_back("executor draining: summary abandoned")
        if not context.recap_text(reply):  # nothing to record: the prompt goes whole this time
            log.warning(
                "run %s: the model wrote no recap of steps %d-%d",
                self.run_id,
                span.from_seq,
                span.through_seq,
            )
            return None
        await self._commit(
            [steps.summary(seq, span, reply, self.spec.model)], tokens=reply.usage.total
        )
        faults.point("executor.summary.after_commit")
        log.info(
            "run %s: steps %d-%d recapped at step %d (prompt ~%d tokens)",
            self.run_id,
            span.from_seq,
            span.through_seq,
            seq,
            span.prompt_tokens,
        )
        return None

    @functools.cached_property
    def _settings(self) -> ModelSettings:
        """The version's model settings (the spec is the same for the whole hold)."""
        return profiles.settings_of(self.spec)

    def _tools(self) -> list[dict[str, Any]]:
        """The agent's tool schemas, the same bytes on every call (the stable prefix).

        Built once per hold: the run's catalogue and spec do not change while it is held,
        and nothing downstream changes the schemas (each call gets its own outer list)."""
        if self._tool_schemas is None:
            schemas = self._catalogue.openai_tools(self.spec.tools)
            self._tool_schemas = context.stable_tools(schemas)
        return list(self._tool_schemas)

    def _streamed(self, seq: int) -> Callable[[str], None] | None:
        """A fast-path run's model output goes to its watchers as it comes (not stored)."""
        send = self._deps.deltas
        if send is None or not self.spec.fast_path:
            return None
        index = itertools.count()

        def forward(text: str) -> None:
            send(executor_pb2.ModelDelta(lease=self.lease, seq=seq, index=next(index), text=text))

        return forward

    async def _ask_model(
        self,
        seq: int,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        on_delta: Callable[[str], None] | None = None,
    ) -> ModelReply | None:
        """The model's reply, or None if the drain deadline interrupted the call.

        The call runs as its own task, which `interrupt()` cancels (no watcher task per
        call); a cancellation of this run's own task still propagates."""
        if self._handoff_now.is_set():
            return None
        try:
            # A model request is a send as much as a tool request: a holder stopped past
            # its send horizon must not ask again what its successor has asked already.
            await self._guard()
        except horizon.Refused as exc:
            raise HandBack(f"not asked: {exc}") from None
        call = asyncio.ensure_future(
            profiles.ask(self._deps.model, self.spec, messages, tools, self.run_id, seq, on_delta)
        )
        self._model_call = call
        try:
            return await call
        except horizon.Refused as exc:  # the last-moment check: nothing was written
            raise HandBack(f"not asked: {exc}") from None
        except asyncio.CancelledError:
            if cancelling() or not self._handoff_now.is_set():
                raise
            return None  # interrupted by the drain deadline
        finally:
            self._model_call = None
            if not call.done():
                call.cancel()

    # -- tools --------------------------------------------------------------

    async def _vet(self, action: StartTool) -> tuple[Tool, constraints.Verdict] | None:
        """The tool and what the constraints say, or None: the call was refused (and its
        error result committed; nothing is sent, the model reads why on its next turn)."""
        checked = self._check(action, replay.next_seq(self.entries))
        if isinstance(checked, executor_pb2.NewStep):
            log.info(
                "run %s: tool call %s refused: %s",
                self.run_id,
                action.call.id,
                steps.as_entry(checked).payload.get("error"),
            )
            await self._commit([checked])
            return None
        return checked

    def _check(
        self, action: StartTool, seq: int
    ) -> tuple[Tool, constraints.Verdict] | executor_pb2.NewStep:
        """The tool and the constraints' verdict, or the refusal to record at `seq` (pure)."""
        call = action.call
        try:
            tool = self._catalogue.check_call(
                call.name, call.arguments, self.spec.tools, call.arguments_raw
            )
            credentials.account_of(
                self.spec.connections, tool, credentials.triggering(self.entries)
            )
        except ToolCallRejected as exc:
            return steps.tool_result(
                seq, action.decision_seq, call.id, call.name, "error", error=str(exc)
            )
        verdict = constraints.check(
            self.spec.constraints,
            tool.name,
            call.arguments or {},
            constraints.trigger_mail(self.entries),
        )
        if verdict.refusal is not None:
            return steps.tool_result(
                seq,
                action.decision_seq,
                call.id,
                call.name,
                "error",
                error=verdict.refusal,
                extra={"refused_by": verdict.rule},
            )
        return tool, verdict

    async def _start_tool(self, action: StartTool) -> str | None:
        call = action.call
        vetted = await self._vet(action)
        if vetted is None:
            return None
        tool, verdict = vetted
        seq = replay.next_seq(self.entries)
        arguments: Mapping[str, Any] = call.arguments or {}
        if action.approval is None and (
            verdict.approval is not None or approval.needs_approval(tool, self.spec)
        ):
            return await self._hold(action, tool, verdict.approval)
        started = steps.tool_started(
            seq, action.decision_seq, call.id, tool.name, arguments, self.run_id, tool.call_class
        )
        if tool.provider == "internal":
            return await self._start_internal(started, call.id, tool.name, arguments)
        await self._commit([started], tool_calls=1)
        faults.point("executor.tool.after_started_commit")
        return await self._send(tool, started, call.id, arguments)

    async def _send(
        self, tool: Tool, started: executor_pb2.NewStep, call_id: str, arguments: Mapping[str, Any]
    ) -> str | None:
        """Send a call whose `tool_started` step landed, under its key; record the outcome."""
        seq = started.seq
        try:
            with child_span(
                "agentrun.tool",
                kind=SpanKind.CLIENT,
                attributes={"agentrun.seq": seq, "agentrun.tool": tool.name},
            ):
                outcome = await self._deps.delivery.send(
                    tool,
                    self._outbound(tool, arguments),
                    keys.derive(self.run_id, seq),
                    self._guard,
                    **self._as_account(tool),
                )
        except RateLimited as exc:
            return await self._park_rate(exc, seq)
        except credentials.ConnectionUnusable as exc:
            return await self._park_connection(exc, seq)
        except horizon.Refused as exc:  # our own side held it back: never the call's outcome
            return await self._hand_back(str(exc), None if exc.may_have_left else seq)
        faults.point("executor.tool.after_response")
        return await self._record(seq + 1, seq, call_id, tool.name, outcome)

    async def _hold(self, action: StartTool, tool: Tool, reason: str | None = None) -> str:
        """Hold the call for a human: step, approval and park in one commit; then let go."""
        seq = replay.next_seq(self.entries)
        held = approval.hold(seq, action.decision_seq, action.call, tool, self.spec, reason)
        await self._commit([held.step], park=held.park, approval_request=held.request)
        log.info(
            "run %s: %s waits for approval %s", self.run_id, tool.name, held.request.approval_id
        )
        return "parked"

    async def _refuse(self, action: RefuseCall) -> None:
        """A rejected (or tampered) approval: the model reads why; nothing is sent."""
        seq = replay.next_seq(self.entries)
        if action.tampered:
            log.error(
                "run %s: approval of %s refused: %s", self.run_id, action.call.id, action.text
            )
        outcome = (
            Outcome("error", error=action.text)
            if action.tampered
            else Outcome("rejected", output=action.text)
        )
        await self._commit_result(
            seq, action.decision_seq, action.call.id, action.call.name, outcome
        )

    async def _start_internal(
        self, started: executor_pb2.NewStep, call_id: str, name: str, arguments: Mapping[str, Any]
    ) -> str | None:
        if name == payloads.READ_RESULT:
            await self._commit([started], tool_calls=1)
            faults.point("executor.tool.after_started_commit")
            return await self._read_result(started.seq + 1, started.seq, call_id, arguments)
        if name == CHILD_TOOL:
            return await self._start_child(started)
        if name == signal_wait.TOOL:
            return await self._wait_signal(started, arguments, signal_wait.timeout_of(arguments))
        if name == CANARY_TOOL:  # started, then its result: two commits, no provider
            await self._commit([started], tool_calls=1)
            outcome = Outcome("ok", output=canary_output(arguments))
            return await self._record(started.seq + 1, started.seq, call_id, name, outcome)
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

    async def _start_child(self, started: executor_pb2.NewStep) -> str:
        """Started and parked on the child in one commit; the control plane admits the child
        in that commit's transaction and writes its outcome as this call's result, waking
        the run (control_plane/runs/children.py)."""
        park = steps.park(started.seq + 1, CHILD_WAIT, None, "waiting for a child run")
        await self._commit(
            [started, park], park=steps.park_transition(CHILD_WAIT, None), tool_calls=1
        )
        faults.point("executor.child.after_start_commit")
        log.info("run %s parked: waiting for a child run", self.run_id)
        return "parked"

    async def _wait_signal(
        self,
        started: executor_pb2.NewStep | None,
        arguments: Mapping[str, Any],
        wake_after: float | None,
    ) -> str:
        """Park (with the call's started step, the first time) until a signal of its name is
        the call's result, or the timeout wakes the run (executor/signal_wait.py)."""
        new = [started] if started is not None else []
        seq = started.seq + 1 if started is not None else replay.next_seq(self.entries)
        step, transition = signal_wait.park(seq, arguments, wake_after)
        await self._commit([*new, step], park=transition, tool_calls=len(new))
        log.info("run %s parked: waiting for signal %r", self.run_id, arguments.get("name"))
        return "parked"

    async def _signal_unanswered(self, started: replay.Entry, seq: int) -> str | None:
        """Resumed with the wait still open: its timeout passed, or it waits again."""
        arguments = started.payload.get("arguments") or {}
        left = signal_wait.remaining(started, self._deps.wall_clock())
        if left is None or left > signal_wait.CLOCK_TOLERANCE:
            return await self._wait_signal(None, arguments, left)
        call_id = str(started.payload.get("call_id", ""))
        outcome = signal_wait.timed_out(arguments)
        return await self._record(seq, started.seq, call_id, signal_wait.TOOL, outcome)

    async def _resolve_unknown(self, action: ResolveUnknown) -> str | None:
        started = action.started
        payload = started.payload
        call_id, name = str(payload.get("call_id", "")), str(payload.get("tool", ""))
        arguments = payload.get("arguments") or {}
        seq = replay.next_seq(self.entries)
        if name == payloads.READ_RESULT:  # a read: read again
            return await self._read_result(seq, started.seq, call_id, arguments)
        if name == CHILD_TOOL:  # the child's end writes the result; until then, wait
            return await self._park(CHILD_WAIT, None, "waiting for a child run")
        if name == signal_wait.TOOL:  # a signal writes the result; or the timeout passed
            return await self._signal_unanswered(started, seq)
        if action.call_class == "internal":
            # The sleep's wake time has passed: that is its result.
            outcome = Outcome("ok", output={"slept_seconds": arguments.get("seconds")})
        else:
            unsent = rate_parks.unsent(self.entries, started.seq, self.lease.epoch)
            try:
                outcome = await self._resend(action, name, arguments, unsent)
            except RateLimited as exc:
                # Still known unsent only if it was so before this attempt.
                return await self._park_rate(exc, started.seq if unsent else None)
            except credentials.ConnectionUnusable as exc:
                return await self._park_connection(exc, started.seq if unsent else None)
            except horizon.Refused as exc:
                known = unsent and not exc.may_have_left
                return await self._hand_back(str(exc), started.seq if known else None)
        log.info(
            "run %s: unknown outcome of %s (%s) resolved: %s %s",
            self.run_id,
            name,
            action.call_class,
            outcome.status,
            outcome.resolution or "",
        )
        return await self._record(seq, started.seq, call_id, name, outcome)

    async def _resend(
        self, action: ResolveUnknown, name: str, arguments: Any, unsent: bool = False
    ) -> Outcome:
        started = action.started
        key = str(started.payload.get("idempotency_key") or keys.derive(self.run_id, started.seq))
        # The key's age decides whether the provider still remembers it.
        age = self._deps.wall_clock() - started.created_at if started.created_at else 0.0
        tool = self._catalogue.get(name)
        if tool is not None:
            arguments = self._outbound(tool, arguments)
        if tool is not None and unsent:
            # Held back by a rate limit: it never left, so it goes out now, under its key.
            outcome = await self._deps.delivery.send(
                tool, arguments, key, self._guard, **self._as_account(tool)
            )
        else:
            outcome = await self._deps.delivery.resolve_unknown(
                tool,
                action.call_class,
                arguments,
                key,
                self._guard,
                age,
                **self._as_account(tool),
            )
        if outcome.status in ("ok", "error"):  # the provider answered
            faults.point("executor.tool.after_response")
        return outcome

    def _as_account(self, tool: Tool | None) -> dict[str, credentials.Credential]:
        """The delivery's `credential` argument, when the tool acts as a connected account."""
        credential = self._credential(tool)
        return {"credential": credential} if credential is not None else {}

    def _credential(self, tool: Tool | None) -> credentials.Credential | None:
        """The connected account the agent version names for the tool's provider."""
        fetch = self._deps.connection_token
        if tool is None or fetch is None:
            return None
        lease = self.lease

        async def token(connection_id: str) -> credentials.Granted:
            return await fetch(lease, connection_id)

        trigger = credentials.triggering(self.entries)
        return credentials.for_tool(self.spec.connections, tool, token, trigger)

    def _outbound(self, tool: Tool, arguments: Mapping[str, Any]) -> Mapping[str, Any]:
        """What is sent: the recorded arguments, and the chain marker on mail."""
        return chain.stamp(tool, arguments, self._chain_depth, self._deps.installation)

    async def _read_result(
        self, seq: int, ref_seq: int, call_id: str, arguments: Mapping[str, Any]
    ) -> str | None:
        """Answer a read_result call from the run's payloads (a read: no side effect)."""
        if self._deps.large_results is None:
            outcome = Outcome("error", error="this executor stores no payloads")
            return await self._record(seq, ref_seq, call_id, payloads.READ_RESULT, outcome)
        outcome, origin = await self._deps.large_results.read(
            self.lease, self.entries, arguments, self._lease_safe
        )
        return await self._record(seq, ref_seq, call_id, payloads.READ_RESULT, outcome, origin)

    def _lease_safe(self) -> bool:
        return self._deps.leases.is_safe(self.run_id)

    async def _large(self, tool: str, outcome: Outcome) -> tuple[Any, dict[str, Any] | None]:
        """The output to record and, when it was stored as a payload, the reference."""
        store = self._deps.large_results
        if store is None or outcome.status != "ok" or tool == payloads.READ_RESULT:
            return outcome.output, None
        return await store.store(self.lease, outcome.output, self._lease_safe)

    async def _record(
        self,
        seq: int,
        ref_seq: int,
        call_id: str,
        tool: str,
        outcome: Outcome,
        origin: str | None = None,
    ) -> str | None:
        """Commit what a send or a resolution came to; park when it is not settled."""
        parks = replay.trailing_parks(self.entries, "retry")
        outcome = after_parks(outcome, parks)
        if outcome.status == "pending":
            # Nothing recorded: the call stays started, resolved again on waking.
            delay = pending_backoff(parks, outcome.retry_after, self._deps.rng)
            return await self._park("retry", delay, outcome.resolution or "tool call not settled")
        if origin is None and untrusted.reads_untrusted(self._catalogue.get(tool)):
            origin = f"tool:{tool}"
        output, stored = await self._large(tool, outcome)
        result = steps.tool_result(
            seq,
            ref_seq,
            call_id,
            tool,
            outcome.status,
            output=output,
            error=outcome.error,
            resolution=outcome.resolution,
            untrusted=origin,
            extra=stored,
        )
        if outcome.status != "unknown":
            await self._commit([result])
            faults.point("executor.tool.after_result_commit")
            return None
        # Nothing may settle it: recorded as unknown, and a person decides
        # (RunService.ResolveUnknownOutcome wakes the run).
        note = f"the outcome of {tool} (step {seq}) is unknown: waiting for a person's decision"
        park = steps.park(seq + 1, "human", None, note)
        await self._commit([result, park], park=steps.park_transition("human", None))
        faults.point("executor.tool.after_result_commit")
        log.warning("run %s: outcome of %s unknown; parked for a person", self.run_id, tool)
        return "parked"

    def _carried_over(self) -> bool:
        """The lease came over a reconnect: it may commit, never send (executor/horizon.py)."""
        return self._deps.leases.carried_over(self.run_id)

    def _unsent_call(self, action: replay.Action) -> int | None:
        """The seq of the started call `action` resolves, if it is known never to have left
        (executor/ratelimit/parks.py's `unsent`); else None."""
        if not isinstance(action, ResolveUnknown):
            return None
        seq = action.started.seq
        return seq if rate_parks.unsent(self.entries, seq, self.lease.epoch) else None

    async def _guard(self) -> None:
        """Self-fencing: never send a request under a lease that may lapse meanwhile, nor
        past the send horizon (a missing acknowledgement is waited for, never guessed).
        A lost lease stops the run; a lease that may not send (its stream gone, or too
        close to expiry) refuses the request, and the run hands itself back."""
        refusal = await self._deps.leases.wait_to_send(self.run_id)
        if refusal == NOT_HELD:
            raise RunFenced(refusal)
        if refusal is not None:
            raise horizon.Refused(f"not sent: {refusal}")

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

    async def _park_rate(self, limited: RateLimited, call_seq: int | None) -> str:
        """Park until a token is due; `call_seq`: the call held back, if known never sent."""
        park = rate_parks.park_step(
            replay.next_seq(self.entries), limited, call_seq, self.lease.epoch
        )
        wake = limited.wake_after
        await self._commit([park], park=steps.park_transition(rate_parks.WAIT_REASON, wake))
        log.info("run %s parked (rate, %s, wake after %.2fs)", self.run_id, limited.cause, wake)
        return "parked"

    async def _park_connection(
        self, exc: credentials.ConnectionUnusable, call_seq: int | None
    ) -> str:
        """Park until the connection is reconnected. This time the call never reached its
        provider (or was refused before it acted): with `call_seq` (known unsent before, too)
        it goes out on resume under its key, else it is resolved by its class again."""
        park = credentials.park_step(replay.next_seq(self.entries), exc, call_seq, self.lease.epoch)
        transition = executor_pb2.Park(
            wait_reason=credentials.WAIT_REASON, connection_id=exc.connection_id
        )
        await self._commit([park], park=transition)
        log.warning("run %s parked: %s", self.run_id, exc)
        return "parked"

    async def _hand_back(self, note: str, unsent_seq: int | None = None) -> str:
        """Park as handed back, to be claimed afresh (at once, unless handed back
        HANDOFFS_AT_ONCE times in a row already). `unsent_seq`: a started call known never
        to have left, which the next holder sends under its key whatever its class."""
        seq = replay.next_seq(self.entries)
        parks = replay.trailing_parks(self.entries, "handoff")
        wait = 0.0 if parks < HANDOFFS_AT_ONCE else min(HANDOFF_WAIT_CAP, 2.0 ** (parks - 3))
        mark = None if unsent_seq is None else rate_parks.unsent_mark(unsent_seq, self.lease.epoch)
        park = steps.park(seq, "handoff", wait, note, mark)
        await self._commit([park], park=steps.park_transition("handoff", wait))
        log.info("run %s handed back (%s)", self.run_id, note)
        return "parked"

    async def _park(self, reason: str, wake_after: float | None, note: str) -> str:
        """Park until `wake_after` seconds pass, or (None) until an event wakes the run."""
        park = steps.park(replay.next_seq(self.entries), reason, wake_after, note)
        await self._commit([park], park=steps.park_transition(reason, wake_after))
        wake = "on an event" if wake_after is None else f"after {wake_after:.1f}s"
        log.info("run %s parked (%s, wake %s)", self.run_id, reason, wake)
        return "parked"

    async def _commit(
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
    ) -> None:
        """Commit steps (and a transition) under this lease; return only once they landed."""
        message = executor_pb2.Commit(
            lease=self.lease,
            steps=new_steps,
            park=park,
            complete=complete,
            fail=fail,
            approval_request=approval_request,
            model_calls=model_calls,
            tool_calls=tool_calls,
            tokens=tokens,
        )
        if (size := message.ByteSize()) > self._deps.max_commit_bytes:
            raise RunInvalid(
                f"a commit of {size} bytes is over the {self._deps.max_commit_bytes}-byte limit"
            )
        reply = await self._traced_send(message)
        if park is not None:
            m.PARKS.labels(park.wait_reason).inc()
        self._deps.leases.committed(self.run_id, self.lease.epoch, reply.result, reply.sent_at)
        self.entries.extend(steps.as_entry(step) for step in new_steps)
        if log.isEnabledFor(logging.DEBUG):
            kinds = ", ".join(replay.kind_name(step.kind) for step in new_steps)
            log.debug("run %s committed %s", self.run_id, kinds)

    async def _traced_send(self, message: executor_pb2.Commit) -> CommitReply:
        """A span per commit, which the control plane continues (the message carries its
        traceparent), and inside it one span per step the commit landed. Without an
        exporter (tracing.on() False) none is made: they would record nothing."""
        if not tracing.on():
            return await self._send_until_accepted(message)
        attributes = {
            "agentrun.steps.seq": [step.seq for step in message.steps],
            "agentrun.transition": message.WhichOneof("transition") or "",
        }
        with _tracer.start_as_current_span(
            "agentrun.commit", kind=SpanKind.CLIENT, attributes=attributes
        ):
            message.traceparent = tracing.current()
            began = time.time_ns()
            reply = await self._send_until_accepted(message)
            for step in message.steps:
                kind = replay.kind_name(step.kind)
                _tracer.start_span(
                    f"step {kind}",
                    start_time=began,
                    attributes={"agentrun.seq": step.seq, "agentrun.step.kind": kind},
                ).end()
            return reply

    async def _send_until_accepted(self, message: executor_pb2.Commit) -> CommitReply:
        """Send the commit until it lands; raises when the lease is lost or would lapse."""
        delay = COMMIT_BACKOFF_START
        clock = asyncio.get_running_loop().time
        while True:
            sent = clock()
            reply = await self._deps.committer.commit(message, self._deps.leases.lease_duration)
            outcome = m.OUTCOMES.get(reply.result.outcome, "unspecified")
            labelled(m.COMMIT_SECONDS, outcome).observe(clock() - sent)
            if self._accepted(reply):
                return reply
            # UNAVAILABLE: the database was unreachable; the very same commit may
            # be sent again (idempotent by run, epoch and seq) while the lease lasts.
            if not self._deps.leases.is_safe(self.run_id):
                raise RunFenced("lease would lapse while the control plane cannot commit")
            await asyncio.sleep(self._deps.rng.uniform(delay / 2, delay))
            delay = min(COMMIT_BACKOFF_CAP, delay * 2)

    def _accepted(self, reply: CommitReply) -> bool:
        outcome = reply.result.outcome
        if outcome == executor_pb2.COMMIT_OUTCOME_OK:
            return True
        if outcome == executor_pb2.COMMIT_OUTCOME_FENCED:
            raise RunFenced(reply.result.message or "commit refused: the lease is lost")
        if outcome == executor_pb2.COMMIT_OUTCOME_INVALID:
            raise RunInvalid(reply.result.message)
        return False


def _where(exc: BaseException) -> str:
    """An exception's class and the file, line and function it was raised in; not its
    message."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return type(exc).__name__
    last = frames[-1]
    return f"{type(exc).__name__} in {last.name} ({os.path.basename(last.filename)}:{last.lineno})"
