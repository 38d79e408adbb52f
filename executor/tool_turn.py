"""The tool turn of a held run: vet a call, hold it for a person, or start, send and record it;
and settle a call found started without a result."""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

from opentelemetry.trace import SpanKind

import faults
from agentrun.v1 import agent_pb2, executor_pb2
from executor import (
    approval,
    constraints,
    horizon,
    internal_tools,
    payloads,
    provenance,
    steps,
    untrusted,
)
from executor.held import HeldRun, child_span, log
from executor.ratelimit import parks as rate_parks
from executor.ratelimit.limiter import RateLimited
from executor.replay import (
    AwaitApproval,
    AwaitPerson,
    HoldRepeat,
    RefuseCall,
    ResolveUnknown,
    StartTool,
    trailing_parks,
)
from executor.tools import chain, credentials, keys
from executor.tools.catalogue import Tool
from executor.tools.delivery import Outcome, after_parks, pending_backoff
from executor.tools.rejection import ToolCallRejected
from telemetry import genai


class RunFailed(Exception):
    """A constraint refused a call and the agent's on_refusal is FAIL: the run was failed
    (the refusal and the failure committed together); nothing more is done in this hold."""


class ToolTurn:
    """Acts on the tool calls of the held run's last decision; one per hold."""

    def __init__(self, held: HeldRun) -> None:
        self.held = held

    async def start(self, action: StartTool) -> str | None:
        try:
            return await self._start(action)
        except RunFailed:
            return "failed"

    async def _start(self, action: StartTool) -> str | None:
        call = action.call
        vetted = await self._vet(action)
        if vetted is None:
            return None
        tool, verdict = vetted
        seq = self.held.next_seq()
        arguments: Mapping[str, Any] = call.arguments or {}
        if action.approval is None and (
            verdict.approval is not None or approval.needs_approval(tool, self.held.spec)
        ):
            return await self._hold(action, tool, verdict)
        started = steps.tool_started(
            seq,
            action.decision_seq,
            call.id,
            tool.name,
            arguments,
            self.held.run_id,
            tool.call_class,
        )
        if tool.provider == "internal":
            internal = internal_tools.starting(tool.name)
            return await internal.start(self, started, call.id, arguments)
        await self.held.loop.commit([started], tool_calls=1)
        faults.point("executor.tool.after_started_commit")
        return await self.send(tool, started, call.id, arguments)

    async def _vet(self, action: StartTool) -> tuple[Tool, constraints.Verdict] | None:
        """The tool and what the constraints say, or None: the call was refused (and its
        error result committed; nothing is sent, the model reads why on its next turn)."""
        checked = self.check(action, self.held.next_seq())
        if isinstance(checked, executor_pb2.NewStep):
            payload = steps.as_entry(checked).payload
            error = str(payload.get("error"))
            log.info("run %s: tool call %s refused: %s", self.held.run_id, action.call.id, error)
            if payload.get("refused_by") and self.held.spec.on_refusal == agent_pb2.ON_REFUSAL_FAIL:
                # The agent says a refusal ends the run: the refusal and the failure land
                # together, so a resumed run never asks the model again.
                finish = steps.finish_failed(checked.seq + 1, error)
                await self.held.loop.commit([checked, finish], fail=executor_pb2.Fail(error=error))
                raise RunFailed(error)
            await self.held.loop.commit([checked])
            return None
        return checked

    def check(
        self, action: StartTool, seq: int
    ) -> tuple[Tool, constraints.Verdict] | executor_pb2.NewStep:
        """The tool and the constraints' verdict, or the refusal to record at `seq` (pure)."""
        call, held = action.call, self.held
        try:
            tool = held.catalogue.check_call(
                call.name, call.arguments, held.spec.tools, call.arguments_raw
            )
            credentials.account_of(
                held.spec.connections, tool, credentials.triggering(held.entries)
            )
        except ToolCallRejected as exc:
            return steps.tool_result(
                seq, action.decision_seq, call.id, call.name, "error", error=str(exc)
            )
        rules = [c for c in held.spec.constraints if c.tool == tool.name]
        ledger = None
        if any(c.rule == agent_pb2.CONSTRAINT_RULE_UNTRUSTED_VALUE for c in rules):
            ledger = provenance.Ledger(held.spec.instructions, held.entries)
        verdict = constraints.check(
            rules,
            tool.name,
            call.arguments or {},
            constraints.trigger_mail(held.entries),
            ledger,
            held.seen,
        )
        if verdict.refusal is not None and held.spec.on_refusal == agent_pb2.ON_REFUSAL_ASK:
            if action.approval is not None:  # a person was asked, and said yes
                return tool, constraints.Verdict()
            return tool, constraints.Verdict(
                approval=verdict.refusal, rule=verdict.rule, origins=verdict.origins
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

    async def send(
        self, tool: Tool, started: executor_pb2.NewStep, call_id: str, arguments: Mapping[str, Any]
    ) -> str | None:
        """Send a call whose `tool_started` step landed, under its key; record the outcome."""
        seq = started.seq
        try:
            with self._span(tool.name, call_id, seq):
                began = time.monotonic()
                outcome = await self.held.deps.delivery.send(
                    tool,
                    self._outbound(tool, arguments),
                    keys.derive(self.held.run_id, seq),
                    self.held.loop.guard,
                    **self._as_account(tool),
                )
                took = round((time.monotonic() - began) * 1000)
        except RateLimited as exc:
            return await self._park_rate(exc, seq)
        except credentials.ConnectionUnusable as exc:
            return await self._park_connection(exc, seq)
        except horizon.Refused as exc:  # our own side held it back: never the call's outcome
            return await self.held.loop.hand_back(str(exc), None if exc.may_have_left else seq)
        faults.point("executor.tool.after_response")
        return await self.record(seq + 1, seq, call_id, tool.name, outcome, duration_ms=took)

    def _span(self, tool: str, call_id: str, seq: int) -> AbstractContextManager[object]:
        """A tool call's span, of the GenAI conventions (telemetry/genai.py)."""
        attributes = {
            "agentrun.seq": seq,
            "agentrun.tool": tool,
            **genai.tool_call(tool, call_id, self.held.run_id),
        }
        return child_span(genai.tool_span_name(tool), kind=SpanKind.INTERNAL, attributes=attributes)

    # -- holds: a person decides first -----------------------------------------

    async def _hold(self, action: StartTool, tool: Tool, verdict: constraints.Verdict) -> str:
        """Hold the call for a human: step, approval and park in one commit; then let go."""
        held = self.held
        hold = approval.hold(
            held.next_seq(),
            action.decision_seq,
            action.call,
            tool,
            held.spec,
            verdict.approval,
            [o.as_dict() for o in verdict.origins],
        )
        await held.loop.commit([hold.step], park=hold.park, approval_request=hold.request)
        log.info(
            "run %s: %s waits for approval %s", held.run_id, tool.name, hold.request.approval_id
        )
        return "parked"

    async def await_approval(self, action: AwaitApproval) -> str:
        note = f"tool call {action.requested.payload.get('call_id')} still waits for approval"
        return await self.held.loop.park("approval", None, note)

    async def refuse(self, action: RefuseCall) -> None:
        """A rejected (or tampered) approval: the model reads why; nothing is sent."""
        seq, call = self.held.next_seq(), action.call
        if action.tampered:
            log.error("run %s: approval of %s refused: %s", self.held.run_id, call.id, action.text)
            step = steps.tool_result(
                seq, action.decision_seq, call.id, call.name, "error", error=action.text
            )
        else:
            step = steps.tool_result(
                seq, action.decision_seq, call.id, call.name, "rejected", output=action.text
            )
        await self.held.loop.commit([step])

    async def hold_repeat(self, action: HoldRepeat) -> str:
        """Not started: the repeat is recorded as held and the run waits for a person
        (the control plane notifies them through the outbox)."""
        hold = steps.repeat_hold(self.held.next_seq(), action)
        await self.held.loop.commit(hold, park=steps.park_transition(steps.REPEAT_WAIT, None))
        log.warning(
            "run %s: %s repeated %d times; parked for a person",
            self.held.run_id,
            action.call.name,
            action.count,
        )
        return "parked"

    async def await_person(self, action: AwaitPerson) -> str:
        """Still no decision (the run was woken or reassigned): park for it again."""
        if action.result.payload.get("held") == "repeat":
            note = f"the repeated call at step {action.result.seq} still waits for a person"
            return await self.held.loop.park(steps.REPEAT_WAIT, None, note)
        note = f"the outcome of step {action.result.seq} still waits for a person's decision"
        return await self.held.loop.park("human", None, note)

    # -- unknown outcomes ------------------------------------------------------

    async def resolve_unknown(self, action: ResolveUnknown) -> str | None:
        started = action.started
        seq = self.held.next_seq()
        name = str(started.payload.get("tool", ""))
        internal = internal_tools.resuming(name, action.call_class)
        if internal is not None:
            return await internal.resume(self, action, seq)
        unsent = steps.known_unsent(self.held.entries, started.seq, self.held.lease.epoch)
        began = time.monotonic()
        try:
            outcome = await self._resend(
                action, name, started.payload.get("arguments") or {}, unsent
            )
        except RateLimited as exc:
            # Still known unsent only if it was so before this attempt.
            return await self._park_rate(exc, started.seq if unsent else None)
        except credentials.ConnectionUnusable as exc:
            return await self._park_connection(exc, started.seq if unsent else None)
        except horizon.Refused as exc:
            known = unsent and not exc.may_have_left
            return await self.held.loop.hand_back(str(exc), started.seq if known else None)
        took = round((time.monotonic() - began) * 1000)
        return await self.settle(action, seq, outcome, duration_ms=took)

    async def _resend(
        self, action: ResolveUnknown, name: str, arguments: Any, unsent: bool = False
    ) -> Outcome:
        started, held = action.started, self.held
        key = str(started.payload.get("idempotency_key") or keys.derive(held.run_id, started.seq))
        # The key's age decides whether the provider still remembers it.
        age = held.deps.wall_clock() - started.created_at if started.created_at else 0.0
        tool = held.catalogue.get(name)
        if tool is not None:
            arguments = self._outbound(tool, arguments)
        call_id = str(started.payload.get("call_id") or "")
        with self._span(name, call_id, started.seq):
            if tool is not None and unsent:
                # Held back by a rate limit: it never left, so it goes out now, under its key.
                outcome = await held.deps.delivery.send(
                    tool, arguments, key, held.loop.guard, **self._as_account(tool)
                )
            else:
                outcome = await held.deps.delivery.resolve_unknown(
                    tool,
                    action.call_class,
                    arguments,
                    key,
                    held.loop.guard,
                    age,
                    **self._as_account(tool),
                )
        if outcome.status in ("ok", "error"):  # the provider answered
            faults.point("executor.tool.after_response")
        return outcome

    async def settle(
        self, action: ResolveUnknown, seq: int, outcome: Outcome, duration_ms: int | None = None
    ) -> str | None:
        """Record what a call found started without a result was resolved to (`duration_ms`:
        how long resolving it took, when it was sent or looked up)."""
        started = action.started
        name = str(started.payload.get("tool", ""))
        log.info(
            "run %s: unknown outcome of %s (%s) resolved: %s %s",
            self.held.run_id,
            name,
            action.call_class,
            outcome.status,
            outcome.resolution or "",
        )
        call_id = str(started.payload.get("call_id", ""))
        return await self.record(seq, started.seq, call_id, name, outcome, duration_ms=duration_ms)

    # -- what is sent, and as whom ---------------------------------------------

    def _as_account(self, tool: Tool | None) -> dict[str, credentials.Credential]:
        """The delivery's `credential` argument, when the tool acts as a connected account."""
        credential = self._credential(tool)
        return {"credential": credential} if credential is not None else {}

    def _credential(self, tool: Tool | None) -> credentials.Credential | None:
        """The connected account the agent version names for the tool's provider."""
        fetch = self.held.deps.connection_token
        if tool is None or fetch is None:
            return None
        lease = self.held.lease

        async def token(connection_id: str) -> credentials.Granted:
            return await fetch(lease, connection_id)

        trigger = credentials.triggering(self.held.entries)
        return credentials.for_tool(self.held.spec.connections, tool, token, trigger)

    def _outbound(self, tool: Tool, arguments: Mapping[str, Any]) -> Mapping[str, Any]:
        """What is sent: the recorded arguments, and the chain marker on mail."""
        return chain.stamp(tool, arguments, self.held.chain_depth, self.held.deps.installation)

    # -- results ---------------------------------------------------------------

    async def record(
        self,
        seq: int,
        ref_seq: int,
        call_id: str,
        tool: str,
        outcome: Outcome,
        origin: str | None = None,
        duration_ms: int | None = None,
    ) -> str | None:
        """Commit what a send or a resolution came to; park when it is not settled.
        `duration_ms`: how long the send took (recorded: /metrics' step durations)."""
        held = self.held
        parks = trailing_parks(held.entries, "retry")
        outcome = after_parks(outcome, parks)
        if outcome.status == "pending":
            # Nothing recorded: the call stays started, resolved again on waking.
            delay = pending_backoff(parks, outcome.retry_after, held.deps.rng)
            return await held.loop.park(
                "retry", delay, outcome.resolution or "tool call not settled"
            )
        if origin is None and untrusted.reads_untrusted(held.catalogue.get(tool)):
            origin = f"tool:{tool}"
        output, stored = await self._large(tool, outcome)
        if duration_ms is not None:
            stored = {**(stored or {}), "duration_ms": duration_ms}
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
            await held.loop.commit([result])
            faults.point("executor.tool.after_result_commit")
            return None
        return await self._await_decision(result, seq, tool)

    async def _await_decision(self, result: executor_pb2.NewStep, seq: int, tool: str) -> str:
        """Nothing may settle it: recorded as unknown, and a person decides
        (RunService.ResolveUnknownOutcome wakes the run)."""
        note = f"the outcome of {tool} (step {seq}) is unknown: waiting for a person's decision"
        park = steps.park(seq + 1, "human", None, note)
        await self.held.loop.commit([result, park], park=steps.park_transition("human", None))
        faults.point("executor.tool.after_result_commit")
        log.warning("run %s: outcome of %s unknown; parked for a person", self.held.run_id, tool)
        return "parked"

    async def _large(self, tool: str, outcome: Outcome) -> tuple[Any, dict[str, Any] | None]:
        """The output to record and, when it was stored as a payload, the reference."""
        store = self.held.deps.large_results
        if store is None or outcome.status != "ok" or tool == payloads.READ_RESULT:
            return outcome.output, None
        return await store.store(self.held.lease, outcome.output, self.held.lease_safe)

    # -- parks of a call that did not leave ------------------------------------

    async def _park_rate(self, limited: RateLimited, call_seq: int | None) -> str:
        """Park until a token is due; `call_seq`: the call held back, if known never sent."""
        held = self.held
        park = rate_parks.park_step(held.next_seq(), limited, call_seq, held.lease.epoch)
        wake = limited.wake_after
        await held.loop.commit([park], park=steps.park_transition(rate_parks.WAIT_REASON, wake))
        log.info("run %s parked (rate, %s, wake after %.2fs)", held.run_id, limited.cause, wake)
        return "parked"

    async def _park_connection(
        self, exc: credentials.ConnectionUnusable, call_seq: int | None
    ) -> str:
        """Park until the connection is reconnected. This time the call never reached its
        provider (or was refused before it acted): with `call_seq` (known unsent before, too)
        it goes out on resume under its key, else it is resolved by its class again."""
        held = self.held
        park = credentials.park_step(held.next_seq(), exc, call_seq, held.lease.epoch)
        transition = executor_pb2.Park(
            wait_reason=credentials.WAIT_REASON, connection_id=exc.connection_id
        )
        await held.loop.commit([park], park=transition)
        log.warning("run %s parked: %s", held.run_id, exc)
        return "parked"
