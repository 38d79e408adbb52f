"""The model turn of a held run: ask the model (recapping first when the prompt grew past
the run's threshold), then commit its decision before anything acts on it."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.trace import Span, SpanKind

import faults
from agentrun.v1 import executor_pb2
from executor import approval, context, deltas, horizon, replay, steps, transcript
from executor import metrics as m
from executor.held import HandBack, HeldRun, child_span, log
from executor.models import profiles
from executor.models.base import ModelRejected, ModelReply, ModelSettings, ModelUnavailable
from executor.replay import CallModel, StartTool
from executor.stream import cancelling
from executor.tool_turn import ToolTurn
from executor.tools.catalogue import Tool
from telemetry import genai
from telemetry.scrape import labelled

MODEL_BACKOFF_START = 1.0
MODEL_BACKOFF_CAP = 60.0
MAX_RETRY_AFTER = 3600.0


def model_backoff(parks: int, retry_after: float | None, rng: random.Random) -> float:
    """Seconds to park after the model provider failed `parks` times in a row already."""
    delay = min(MODEL_BACKOFF_CAP, MODEL_BACKOFF_START * 2**parks)
    delay = rng.uniform(delay / 2, delay)
    if retry_after is not None:
        delay = max(delay, min(retry_after, MAX_RETRY_AFTER))
    return round(delay, 3)


class ModelTurn:
    """Asks the model for the held run's next decision and commits it; one per hold."""

    def __init__(self, held: HeldRun, tools: ToolTurn) -> None:
        self._held = held
        self._tools = tools
        # The turns' rendered messages, kept across this run's model calls (transcript.py).
        self._rendered = transcript.RenderedTurns()
        self._abandon = asyncio.Event()  # set by interrupt(): no model call is awaited
        self._call: asyncio.Task[ModelReply] | None = None  # in flight, for interrupt()
        self._schemas: list[dict[str, Any]] | None = None  # _tool_schemas(), built on first use

    def interrupt(self) -> None:
        """Drain deadline: abandon an in-flight model call (nothing of it is committed)."""
        self._abandon.set()
        if self._call is not None:
            self._call.cancel()

    async def call(self, action: CallModel) -> str | None:
        """Ask the model for the run's next decision (`action` says only that it is due) and
        commit it; returns how the run ended, if it did."""
        held = self._held
        if ended := await self._summarise():
            return ended
        seq = held.next_seq()
        messages = transcript.build_messages(held.entries, held.spec.instructions, self._rendered)
        chunks = self._streamed(seq)
        try:
            try:
                on_delta = chunks.piece if chunks is not None else None
                reply = await self._ask(seq, messages, self._tool_schemas(), on_delta)
            finally:
                if chunks is not None:
                    chunks.flush()  # before the decision is committed
        except ModelUnavailable as exc:
            m.MODEL_CALLS.labels("unavailable").inc()
            return await self._model_unavailable(exc)
        except ModelRejected as exc:
            m.MODEL_CALLS.labels("rejected").inc()
            return await held.loop.fail(exc.reason)
        labelled(m.MODEL_CALLS, "ok").inc()
        if reply is None:  # interrupted by the drain deadline
            return await held.loop.hand_back("executor draining: model call abandoned")
        faults.point("executor.model.after_response")
        reply = dataclasses.replace(reply, tool_calls=steps.unique_call_ids(reply.tool_calls, seq))
        return await self._commit_reply(seq, reply)

    async def _commit_reply(self, seq: int, reply: ModelReply) -> str | None:
        """Commit the model's decision; with no tool calls, the run ends with it."""
        held = self._held
        decision = steps.decision(seq, reply, held.spec.model)
        counts = {"model_calls": 1, "tokens": reply.usage.total}
        if error := steps.failed_reply(reply, self._settings):
            # No answer to act on (cut off, filtered, refused): recorded, and the run fails.
            finish = steps.finish_failed(seq + 1, error)
            await held.loop.commit(
                [decision, finish], fail=executor_pb2.Fail(error=error), **counts
            )
            log.info("run %s failed: %s", held.run_id, error)
            return "failed"
        if reply.tool_calls:
            return await self._commit_decision(decision, counts)
        # No tool calls: the answer is final; decision and finish land together.
        finish, output = steps.completion(seq + 1, reply.content or "", held.entries)
        await held.loop.commit(
            [decision, finish], complete=executor_pb2.Complete(output=output), **counts
        )
        faults.point("executor.decision.after_commit")
        log.info("run %s completed", held.run_id)
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
            await self._held.loop.commit([decision], **counts)
            faults.point("executor.decision.after_commit")
            return None
        tool, started, call_id, arguments = ahead
        await self._held.loop.commit([decision, started], tool_calls=1, **counts)
        faults.point("executor.decision.after_commit")
        faults.point("executor.tool.after_started_commit")
        return await self._tools.send(tool, started, call_id, arguments)

    def _start_ahead(
        self, decision: executor_pb2.NewStep
    ) -> tuple[Tool, executor_pb2.NewStep, str, Mapping[str, Any]] | None:
        """The tool and `tool_started` step of the decision's first call if the loop's next
        step would be to start it and send it (no handoff, limit, refusal, approval or
        internal tool in the way); else None, and the decision is committed alone."""
        held = self._held
        if held.handoff.is_set() or held.carried_over():
            return None
        entries = [*held.entries, steps.as_entry(decision)]
        action = replay.next_action(entries, held.run.limits.repeat_limit)
        if not isinstance(action, StartTool) or action.approval is not None:
            return None
        if held.over_limit(entries, action):
            return None
        checked = self._tools.check(action, decision.seq + 1)
        if isinstance(checked, executor_pb2.NewStep):
            return None
        tool, verdict = checked
        if tool.provider == "internal" or verdict.approval is not None:
            return None
        if approval.needs_approval(tool, held.spec):
            return None
        call, arguments = action.call, action.call.arguments or {}
        started = steps.tool_started(
            decision.seq + 1,
            decision.seq,
            call.id,
            tool.name,
            arguments,
            held.run_id,
            tool.call_class,
        )
        if decision.ByteSize() + started.ByteSize() + 4096 > held.deps.max_commit_bytes:
            return None  # each fits alone: two commits rather than one refused
        return tool, started, call.id, arguments

    async def _model_unavailable(self, exc: ModelUnavailable) -> str:
        """Park with backoff while the provider is down; fail once the run's budget is spent."""
        held = self._held
        retry = held.deps.model_retry
        parks = replay.trailing_parks(held.entries, "model")
        budget = retry.budget(held.run.limits.model_retry_budget)
        if parks >= budget:
            return await held.loop.fail(retry.give_up(budget, exc.reason))
        delay = retry.delay(parks, exc.retry_after, held.deps.rng)
        log.warning("run %s: model unavailable (%s); parking %.1fs", held.run_id, exc, delay)
        return await held.loop.park("model", delay, exc.reason)

    async def _summarise(self) -> str | None:
        """Past the run's context threshold, first recap the older steps as a step of its
        own (executor/context.py); returns how the run ended if asking for it ended it."""
        held = self._held
        tools, instructions = self._tool_schemas(), held.spec.instructions
        threshold = held.run.limits.context_tokens
        span = context.plan(held.entries, instructions, tools, threshold, self._rendered)
        if span is None:
            return None
        seq = held.next_seq()
        try:
            reply = await self._ask(
                seq, context.request_messages(held.entries, instructions, span), tools
            )
        except ModelUnavailable as exc:
            return await self._model_unavailable(exc)
        except ModelRejected as exc:
            return await held.loop.fail(
                f"asked to summarise the run, the model refused: {exc.reason}"
            )
        if reply is None:  # interrupted by the drain deadline
            return await held.loop.hand_back("executor draining: summary abandoned")
        if not context.recap_text(reply):  # nothing to record: the prompt goes whole this time
            log.warning(
                "run %s: the model wrote no recap of steps %d-%d",
                held.run_id,
                span.from_seq,
                span.through_seq,
            )
            return None
        await held.loop.commit(
            [steps.summary(seq, span, reply, held.spec.model)], tokens=reply.usage.total
        )
        faults.point("executor.summary.after_commit")
        log.info(
            "run %s: steps %d-%d recapped at step %d (prompt ~%d tokens)",
            held.run_id,
            span.from_seq,
            span.through_seq,
            seq,
            span.prompt_tokens,
        )
        return None

    @functools.cached_property
    def _settings(self) -> ModelSettings:
        """The version's model settings (the spec is the same for the whole hold)."""
        return profiles.settings_of(self._held.spec)

    def _tool_schemas(self) -> list[dict[str, Any]]:
        """The agent's tool schemas, the same bytes on every call (the stable prefix).

        Built once per hold: the run's catalogue and spec do not change while it is held,
        and nothing downstream changes the schemas (each call gets its own outer list)."""
        if self._schemas is None:
            schemas = self._held.catalogue.openai_tools(self._held.spec.tools)
            self._schemas = context.stable_tools(schemas)
        return list(self._schemas)

    def _streamed(self, seq: int) -> deltas.Chunks | None:
        """The call's output goes to the run's watchers and Durable Stream as it comes, in
        small chunks (executor/deltas.py): every call's, or a fast-path run's only when
        AGENTRUN_MODEL_STREAM is off."""
        send, held = self._held.deps.deltas, self._held
        if send is None or not (held.deps.stream_every_call or held.spec.fast_path):
            return None
        return deltas.Chunks(send, held.lease, seq)

    async def _ask(
        self,
        seq: int,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        on_delta: Callable[[str], None] | None = None,
    ) -> ModelReply | None:
        """The model's reply, timed (`duration_ms`, recorded in its step), in a span of
        the GenAI conventions (telemetry/genai.py); None if the drain deadline interrupted
        the call."""
        held = self._held
        provider, model = profiles.requested(held.deps.model, held.spec)
        attributes = {"agentrun.seq": seq, **genai.chat_request(provider, model, held.run_id)}
        name = genai.chat_span_name(model)
        with child_span(name, kind=SpanKind.CLIENT, attributes=attributes) as span:
            began = time.monotonic()
            reply = await self._call_model(seq, messages, tools, on_delta)
            if reply is None:
                return None
            reply = dataclasses.replace(reply, duration_ms=round((time.monotonic() - began) * 1000))
            if isinstance(span, Span):
                usage = reply.usage
                span.set_attributes(
                    genai.chat_response(
                        reply.model,
                        reply.response_id,
                        usage.prompt_tokens,
                        usage.completion_tokens,
                        reply.stop_reason,
                    )
                )
            return reply

    async def _call_model(
        self,
        seq: int,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        on_delta: Callable[[str], None] | None = None,
    ) -> ModelReply | None:
        """The model's reply, or None if the drain deadline interrupted the call.

        The call runs as its own task, which `interrupt()` cancels (no watcher task per
        call); a cancellation of this run's own task still propagates."""
        if self._abandon.is_set():
            return None
        held = self._held
        try:
            # A model request is a send as much as a tool request: a holder stopped past
            # its send horizon must not ask again what its successor has asked already.
            await held.loop.guard()
        except horizon.Refused as exc:
            raise HandBack(f"not asked: {exc}") from None
        call = asyncio.ensure_future(
            profiles.ask(held.deps.model, held.spec, messages, tools, held.run_id, seq, on_delta)
        )
        self._call = call
        try:
            return await call
        except horizon.Refused as exc:  # the last-moment check: nothing was written
            raise HandBack(f"not asked: {exc}") from None
        except asyncio.CancelledError:
            if cancelling() or not self._abandon.is_set():
                raise
            return None  # interrupted by the drain deadline
        finally:
            self._call = None
            if not call.done():
                call.cancel()
