"""Drives one held run: rebuild from the log, pick the next step, commit it, then act on it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import traceback
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from opentelemetry.trace import SpanKind

from agentrun.v1 import executor_pb2
from executor import horizon, payloads, replay, steps
from executor import metrics as m
from executor.held import HandBack, HeldRun, RunDeps, RunFenced, RunInvalid
from executor.horizon import SEND_GATE
from executor.internal_tools import CHILD_TOOL, CHILD_WAIT
from executor.lease import NOT_HELD
from executor.model_turn import ModelTurn, model_backoff
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
from executor.stream import CommitReply
from executor.tool_turn import ToolTurn
from executor.tools import chain, definitions
from telemetry import logs, tracing
from telemetry.scrape import labelled

# What the worker and the tests import from here; some live beside the parts that use them.
__all__ = [
    "CHILD_TOOL",
    "CHILD_WAIT",
    "CRASH_WAIT",
    "MAX_CRASHES",
    "RunDeps",
    "RunFenced",
    "RunInvalid",
    "RunLoop",
    "model_backoff",
]

log = logging.getLogger(__name__)
_tracer = tracing.tracer(__name__)

COMMIT_BACKOFF_START = 0.1
COMMIT_BACKOFF_CAP = 2.0
# A run whose task failed unexpectedly waits so (RunLoop._crashed), and fails the
# MAX_CRASHES-th time.
CRASH_WAIT = "executor_error"
MAX_CRASHES = 5
# A run handed back this many times in a row is claimed afresh at once; after that it waits
# 1, 2, 4 ... seconds (at most HANDOFF_WAIT_CAP) before each claim: a call our own side keeps
# refusing must not spin through claims.
HANDOFFS_AT_ONCE = 3
HANDOFF_WAIT_CAP = 60.0
# The parks that may leave a turn in progress (a call decided or started and not resolved):
# they say between_turns only when the log says so. Every other park (a sleep, an approval,
# a rate limit, a child, a signal, a person, the model's outage) waits between turns, and
# the run continues on the newest release when it wakes (control_plane/deploys/releases.py).
MID_TURN_PARKS = frozenset({"handoff", CRASH_WAIT})


class RunLoop:
    """One run, from its assignment until it finishes, parks or is fenced.

    `run()` returns how it ended: completed, failed, parked, fenced, invalid
    or done (the log was already finished). A fenced run may also just be
    cancelled by the worker; either way it writes nothing more. The model's
    turn (executor/model_turn.py) and the tools' (executor/tool_turn.py) act
    on the held run; they commit, park, hand back and fail through this loop.
    """

    def __init__(self, assignment: executor_pb2.Assignment, deps: RunDeps) -> None:
        run = assignment.run
        self.run_id = run.run_id
        self.lease = executor_pb2.Lease(
            workspace_id=run.workspace_id, run_id=run.run_id, epoch=run.lease_epoch
        )
        self._deps = deps
        self._handoff = asyncio.Event()
        self._forced = False
        self._handoff_note = "executor draining: handed back"
        self._held = HeldRun(
            run=run,
            spec=assignment.agent_version.spec,
            lease=self.lease,
            entries=replay.decode(assignment.steps),
            deps=deps,
            catalogue=definitions.for_run(deps.catalogue, assignment.tools),
            loop=self,
            chain_depth=chain.run_depth(assignment.steps),
            held_from=deps.wall_clock(),
            handoff=self._handoff,
            seen={(v.tool, v.argument): tuple(v.values) for v in assignment.seen_values},
        )
        self._tools = ToolTurn(self._held)
        self._model = ModelTurn(self._held, self._tools)
        # What the loop does for each next action: one lookup, no chain of checks.
        tools = self._tools
        self._acts: dict[type, Callable[[Any], Awaitable[str | None]]] = {
            CallModel: self._model.call,
            FailRun: self._fail_as_told,
            FinishCompleted: self._complete,
            StartTool: tools.start,
            HoldRepeat: tools.hold_repeat,
            ResolveUnknown: tools.resolve_unknown,
            AwaitApproval: tools.await_approval,
            RefuseCall: tools.refuse,
            AwaitPerson: tools.await_person,
        }

    def request_handoff(self, force: bool = False, note: str | None = None) -> None:
        """Drain: hand the run back at its next turn boundary, when nothing of a turn is in
        flight (it then waits on no release and the newest continues it); `force`: at its
        next step boundary, even mid-turn (it then waits for an executor of this release).
        `note`: what the park step says (a pause says so)."""
        self._forced = self._forced or force
        if note is not None:
            self._handoff_note = note
        self._handoff.set()

    def interrupt(self) -> None:
        """Drain deadline: also abandon an in-flight model call (nothing of it is committed,
        so the run is between turns again)."""
        self._handoff.set()
        self._model.interrupt()

    def turn_seconds(self, model_default: float, tool_default: float) -> float:
        return self._held.turn_seconds(model_default, tool_default)

    async def run(self) -> str:
        """Drive the run; one span (and the log context) per hold, each commit a child."""
        lease = self.lease
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
                "agentrun.attempt": self._held.run.attempt,
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
            for e in self._held.entries
            if e.kind == replay.PARK and e.payload.get("wait_reason") == CRASH_WAIT
        )
        try:
            if crashes >= MAX_CRASHES:
                return await self.fail(
                    f"executor error: the run's task failed {crashes} times, the last with "
                    f"{where}; it is not tried again"
                )
            wait = self._deps.crash_backoff * 2 ** (crashes - 1)
            note = f"the run's task failed ({crashes} of {MAX_CRASHES}) with {where}"
            return await self.park(CRASH_WAIT, wait, note)
        except (RunFenced, RunInvalid, payloads.PayloadFenced) as second:
            log.warning("run %s: could not record its failure: %s", self.run_id, second)
            return "crashed"

    async def _fail_invalid(self, reason: str) -> str:
        """A refused commit would be refused again after every takeover: fail the run
        (visibly, with the reason) instead of leaving it to be reclaimed forever."""
        try:
            return await self.fail(f"internal error: a commit was refused as invalid: {reason}")
        except (RunInvalid, RunFenced) as exc:
            log.error("run %s: could not fail it either: %s", self.run_id, exc)
            return "invalid"

    async def _loop(self) -> str:
        held = self._held
        while True:
            action = replay.next_action(held.entries, held.run.limits.repeat_limit)
            if isinstance(action, Done):
                log.warning("run %s was assigned but its log is finished", self.run_id)
                return "done"
            if self._handoff.is_set() and (isinstance(action, CallModel) or self._forced):
                return await self.hand_back(self._handoff_note)
            if isinstance(action, (StartTool, ResolveUnknown)) and held.carried_over():
                note = "stream replaced since the lease was granted: handed back to send under a fresh one"
                return await self.hand_back(note, self._unsent_call(action))
            if error := held.over_limit(held.entries, action):
                return await self.fail(error)
            try:
                ended = await self._acts[type(action)](action)
            except HandBack as back:
                return await self.hand_back(str(back))
            if ended:
                return ended

    def _unsent_call(self, action: replay.Action) -> int | None:
        """The seq of the started call `action` resolves, if it is known never to have left
        (steps.known_unsent); else None."""
        if not isinstance(action, ResolveUnknown):
            return None
        seq = action.started.seq
        return seq if steps.known_unsent(self._held.entries, seq, self.lease.epoch) else None

    async def guard(self) -> None:
        """Self-fencing: never send a request under a lease that may lapse meanwhile, nor
        past the send horizon (a missing acknowledgement is waited for, never guessed).
        A lost lease stops the run; a lease that may not send (its stream gone, or too
        close to expiry) refuses the request, and the run hands itself back."""
        refusal = await self._deps.leases.wait_to_send(self.run_id)
        if refusal == NOT_HELD:
            raise RunFenced(refusal)
        if refusal is not None:
            raise horizon.Refused(f"not sent: {refusal}")

    # -- how a hold ends ----------------------------------------------------

    async def _complete(self, action: FinishCompleted) -> str:
        finish, output = steps.completion(self._held.next_seq(), action.output, self._held.entries)
        await self.commit([finish], complete=executor_pb2.Complete(output=output))
        log.info("run %s completed", self.run_id)
        return "completed"

    async def _fail_as_told(self, action: FailRun) -> str:
        return await self.fail(action.error)

    async def fail(self, error: str) -> str:
        finish = steps.finish_failed(self._held.next_seq(), error)
        await self.commit([finish], fail=executor_pb2.Fail(error=error))
        log.info("run %s failed: %s", self.run_id, error)
        return "failed"

    async def hand_back(self, note: str, unsent_seq: int | None = None) -> str:
        """Park as handed back, to be claimed afresh (at once, unless handed back
        HANDOFFS_AT_ONCE times in a row already). `unsent_seq`: a started call known never
        to have left, which the next holder sends under its key whatever its class."""
        seq = self._held.next_seq()
        parks = replay.trailing_parks(self._held.entries, "handoff")
        wait = (
            0.0
            if parks < HANDOFFS_AT_ONCE
            else min(HANDOFF_WAIT_CAP, 2.0 ** (parks - HANDOFFS_AT_ONCE))
        )
        mark = None if unsent_seq is None else steps.unsent_mark(unsent_seq, self.lease.epoch)
        park = steps.park(seq, "handoff", wait, note, mark)
        await self.commit([park], park=steps.park_transition("handoff", wait))
        log.info("run %s handed back (%s)", self.run_id, note)
        return "parked"

    async def park(self, reason: str, wake_after: float | None, note: str) -> str:
        """Park until `wake_after` seconds pass, or (None) until an event wakes the run."""
        park = steps.park(self._held.next_seq(), reason, wake_after, note)
        await self.commit([park], park=steps.park_transition(reason, wake_after))
        wake = "on an event" if wake_after is None else f"after {wake_after:.1f}s"
        log.info("run %s parked (%s, wake %s)", self.run_id, reason, wake)
        return "parked"

    # -- commits ------------------------------------------------------------

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
    ) -> None:
        """Commit steps (and a transition) under this lease; return only once they landed."""
        if park is not None:
            park.between_turns = (
                park.wait_reason not in MID_TURN_PARKS or self._held.between_turns()
            )
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
        delay, clock = COMMIT_BACKOFF_START, asyncio.get_running_loop().time
        with _commit_span(message) if tracing.on() else _NO_SPAN:
            # Sent until it lands. UNAVAILABLE: the database was unreachable; the very same
            # commit may be sent again (idempotent by run, epoch and seq) while the lease lasts.
            while True:
                sent = clock()
                reply = await self._deps.committer.commit(message, self._deps.leases.lease_duration)
                outcome = m.OUTCOMES.get(reply.result.outcome, "unspecified")
                labelled(m.COMMIT_SECONDS, outcome).observe(clock() - sent)
                if self._accepted(reply):
                    break
                if not self._deps.leases.is_safe(self.run_id):
                    raise RunFenced("lease would lapse while the control plane cannot commit")
                await asyncio.sleep(self._deps.rng.uniform(delay / 2, delay))
                delay = min(COMMIT_BACKOFF_CAP, delay * 2)
        if park is not None:
            m.PARKS.labels(park.wait_reason).inc()
        self._deps.leases.committed(self.run_id, self.lease.epoch, reply.result, reply.sent_at)
        self._held.entries.extend(steps.as_entry(step) for step in new_steps)
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


# A commit's span when this process exports none (tracing.on() False): they would record
# nothing, and the hot path makes not even a generator for one.
_NO_SPAN = contextlib.nullcontext()


@contextlib.contextmanager
def _commit_span(message: executor_pb2.Commit) -> Iterator[None]:
    """A span per commit, which the control plane continues (the message carries its
    traceparent), and inside it one span per step the commit landed."""
    attributes = {
        "agentrun.steps.seq": [step.seq for step in message.steps],
        "agentrun.transition": message.WhichOneof("transition") or "",
    }
    with _tracer.start_as_current_span(
        "agentrun.commit", kind=SpanKind.CLIENT, attributes=attributes
    ):
        message.traceparent = tracing.current()
        began = time.time_ns()
        yield
        for step in message.steps:
            kind = replay.kind_name(step.kind)
            _tracer.start_span(
                f"step {kind}",
                start_time=began,
                attributes={"agentrun.seq": step.seq, "agentrun.step.kind": kind},
            ).end()


def _where(exc: BaseException) -> str:
    """An exception's class and the file, line and function it was raised in; not its
    message."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return type(exc).__name__
    last = frames[-1]
    return f"{type(exc).__name__} in {last.name} ({os.path.basename(last.filename)}:{last.lineno})"
