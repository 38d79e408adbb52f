"""The executor's own tools (provider "internal"), one object each, found by name in TOOLS.

Each says how a call of it starts (its `tool_started` step is built; committing it is the
tool's own business: alone, with a park, or not at all) and how it resumes: what settles a
call of it found started without a result, after a crash, a wake or a handoff. A new one
registers here; the tool turn (executor/tool_turn.py) dispatches no tool name itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import faults
from agentrun.v1 import executor_pb2
from executor import approval, canary, constraints, event_wait, payloads, replay, signal_wait, steps
from executor.held import HeldRun, log
from executor.models.base import ToolCall
from executor.replay import Entry, ResolveUnknown
from executor.tools.catalogue import Tool
from executor.tools.delivery import Outcome
from ground import run_labels

# The internal tool that runs another agent, and the wait it parks the run in.
CHILD_TOOL = "start_child"
CHILD_WAIT = "child"
# Runs several at once (fan-out): the same start and park, one result for all of them
# (control_plane/runs/children.py, StartChildren).
CHILDREN_TOOL = "start_children"


class Calls(Protocol):
    """What an internal tool asks of the tool turn (executor/tool_turn.py)."""

    held: HeldRun

    async def record(
        self,
        seq: int,
        ref_seq: int,
        call_id: str,
        tool: str,
        outcome: Outcome,
        origin: str | None = None,
    ) -> str | None: ...

    async def settle(self, action: ResolveUnknown, seq: int, outcome: Outcome) -> str | None: ...

    def check(
        self, action: replay.StartTool, seq: int
    ) -> tuple[Tool, constraints.Verdict] | executor_pb2.NewStep: ...


class InternalTool(Protocol):
    """One internal tool: how a call of it starts, and how it resumes."""

    # The class its `tool_started` step records: a started call is this tool's only if
    # the class agrees (a workspace tool named like a built-in records its own).
    call_class: str

    async def start(
        self,
        calls: Calls,
        started: executor_pb2.NewStep,
        call_id: str,
        arguments: Mapping[str, Any],
    ) -> str | None: ...

    async def resume(self, calls: Calls, action: ResolveUnknown, seq: int) -> str | None: ...


def _call_id(started: Entry) -> str:
    return str(started.payload.get("call_id", ""))


def _arguments(started: Entry) -> Mapping[str, Any]:
    return started.payload.get("arguments") or {}


async def _woken(calls: Calls, action: ResolveUnknown, seq: int) -> str | None:
    """Settle an internal call as a sleep whose wake time passed: that is its result. The
    canary and an internal tool this executor does not carry resume so too."""
    outcome = Outcome("ok", output={"slept_seconds": _arguments(action.started).get("seconds")})
    return await calls.settle(action, seq, outcome)


class ReadResult:
    """`read_result`: a slice of a result stored as a payload (executor/payloads.py)."""

    call_class = "read"

    async def start(
        self,
        calls: Calls,
        started: executor_pb2.NewStep,
        call_id: str,
        arguments: Mapping[str, Any],
    ) -> str | None:
        await calls.held.loop.commit([started], tool_calls=1)
        faults.point("executor.tool.after_started_commit")
        return await self._read(calls, started.seq + 1, started.seq, call_id, arguments)

    async def resume(self, calls: Calls, action: ResolveUnknown, seq: int) -> str | None:
        # A read: read again.
        started = action.started
        return await self._read(calls, seq, started.seq, _call_id(started), _arguments(started))

    async def _read(
        self, calls: Calls, seq: int, ref_seq: int, call_id: str, arguments: Mapping[str, Any]
    ) -> str | None:
        """Answer from the run's payloads (a read: no side effect)."""
        held = calls.held
        if held.deps.large_results is None:
            outcome = Outcome("error", error="this executor stores no payloads")
            return await calls.record(seq, ref_seq, call_id, payloads.READ_RESULT, outcome)
        outcome, origin = await held.deps.large_results.read(
            held.lease, held.entries, arguments, held.lease_safe
        )
        return await calls.record(seq, ref_seq, call_id, payloads.READ_RESULT, outcome, origin)


class StartChild:
    """`start_child`: runs another agent; its outcome is this call's result."""

    call_class = "internal"

    async def start(
        self,
        calls: Calls,
        started: executor_pb2.NewStep,
        call_id: str,
        arguments: Mapping[str, Any],
    ) -> str:
        """Started and parked on the child in one commit; the control plane admits the child
        in that commit's transaction and writes its outcome as this call's result, waking
        the run (control_plane/runs/children.py). The start_child calls that follow it in
        the same decision start in that commit too (fan-out): their children run at once,
        and the run wakes when the last of them has its result."""
        batch = [started, *_sibling_children(calls, started)]
        note = (
            "waiting for a child run" if len(batch) == 1 else f"waiting for {len(batch)} child runs"
        )
        park = steps.park(batch[-1].seq + 1, CHILD_WAIT, None, note)
        await calls.held.loop.commit(
            [*batch, park], park=steps.park_transition(CHILD_WAIT, None), tool_calls=len(batch)
        )
        faults.point("executor.child.after_start_commit")
        log.info("run %s parked: %s", calls.held.run_id, note)
        return "parked"

    async def resume(self, calls: Calls, action: ResolveUnknown, seq: int) -> str:
        # The child's end writes the result; until then, wait.
        return await calls.held.loop.park(CHILD_WAIT, None, "waiting for a child run")


def _sibling_children(calls: Calls, started: executor_pb2.NewStep) -> list[executor_pb2.NewStep]:
    """The tool_started steps of the start_child calls that directly follow `started`'s in
    its decision, never acted on, each checked as the tool turn checks a call: the first
    that is another tool, refused, held for approval, a repeat the guard would hold, or
    past the run's tool-call budget ends the batch (it and the rest start one by one)."""
    held = calls.held
    entry = steps.as_entry(started)
    turns = replay.decision_turns(held.entries)
    if entry.payload.get("tool") != CHILD_TOOL or not turns:
        return []
    turn = turns[-1]
    ids = [c.id for c in turn.calls]
    call_id = str(entry.payload.get("call_id", ""))
    if turn.decision.seq != started.ref_seq or ids.count(call_id) != 1:
        return []
    budget = held.run.limits.max_tool_calls
    used = replay.counters(held.entries).tool_calls + 1
    batch: list[executor_pb2.NewStep] = []
    for call in turn.calls[ids.index(call_id) + 1 :]:
        if budget and used + len(batch) >= budget:
            break
        joined = _joins(calls, turns, call, ids, started.seq + 1 + len(batch))
        if joined is None:
            break
        batch.append(joined)
    return batch


def _joins(
    calls: Calls, turns: list[replay.Turn], call: ToolCall, ids: list[str], seq: int
) -> executor_pb2.NewStep | None:
    """`call`'s tool_started step at `seq` if it may start with the batch, else None."""
    held, turn = calls.held, turns[-1]
    if call.name != CHILD_TOOL or turn.steps.get(call.id) or ids.count(call.id) != 1:
        return None
    limit = held.run.limits.repeat_limit
    if limit > 0 and len(replay.repeats(turns, turn.decision.seq, call)) + 1 >= limit:
        return None
    checked = calls.check(replay.StartTool(turn.decision.seq, call), seq)
    if not isinstance(checked, tuple):
        return None
    tool, verdict = checked
    if tool.provider != "internal" or tool.name != CHILD_TOOL or verdict.approval is not None:
        return None
    if approval.needs_approval(tool, held.spec):
        return None
    arguments = call.arguments or {}
    return steps.tool_started(
        seq, turn.decision.seq, call.id, tool.name, arguments, held.run_id, tool.call_class
    )


class WaitForSignal:
    """`wait_for_signal`: parks until a signal of its name arrives, or its timeout
    (executor/signal_wait.py)."""

    call_class = "internal"

    async def start(
        self,
        calls: Calls,
        started: executor_pb2.NewStep,
        call_id: str,
        arguments: Mapping[str, Any],
    ) -> str:
        return await self._wait(calls, started, arguments, signal_wait.timeout_of(arguments))

    async def resume(self, calls: Calls, action: ResolveUnknown, seq: int) -> str | None:
        """Resumed with the wait still open: its timeout passed, or it waits again."""
        started = action.started
        arguments = _arguments(started)
        left = signal_wait.remaining(started, calls.held.deps.wall_clock())
        if left is None or left > signal_wait.CLOCK_TOLERANCE:
            return await self._wait(calls, None, arguments, left)
        outcome = signal_wait.timed_out(arguments)
        return await calls.record(seq, started.seq, _call_id(started), signal_wait.TOOL, outcome)

    async def _wait(
        self,
        calls: Calls,
        started: executor_pb2.NewStep | None,
        arguments: Mapping[str, Any],
        wake_after: float | None,
    ) -> str:
        """Park (with the call's started step, the first time) until a signal of its name is
        the call's result, or the timeout wakes the run."""
        held = calls.held
        new = [started] if started is not None else []
        seq = started.seq + 1 if started is not None else held.next_seq()
        step, transition = signal_wait.park(seq, arguments, wake_after)
        await held.loop.commit([*new, step], park=transition, tool_calls=len(new))
        log.info("run %s parked: waiting for signal %r", held.run_id, arguments.get("name"))
        return "parked"


class WaitForEvent:
    """`wait_for_event`: parks until a published event matches, or its timeout
    (executor/event_wait.py)."""

    call_class = "internal"

    async def start(
        self,
        calls: Calls,
        started: executor_pb2.NewStep,
        call_id: str,
        arguments: Mapping[str, Any],
    ) -> str | None:
        held = calls.held
        try:
            wait = event_wait.wait_of(arguments, event_wait.run_input(held.entries))
        except ValueError as exc:  # answered at once (one commit), the model reads why
            result = steps.tool_result(
                started.seq + 1, started.seq, call_id, event_wait.TOOL, "error", error=str(exc)
            )
            await held.loop.commit([started, result], tool_calls=1)
            return None
        wake_after = event_wait.timeout_of(arguments)
        step, transition = event_wait.park(started.seq + 1, started.seq, wait, wake_after)
        await held.loop.commit([started, step], park=transition, tool_calls=1)
        # The names only: the keys hold values of the run's input.
        names = [slot["name"] for slot in wait.slots]
        log.info("run %s parked: waiting for event(s) %s", held.run_id, names)
        return "parked"

    async def resume(self, calls: Calls, action: ResolveUnknown, seq: int) -> str | None:
        """Resumed with the wait still open: its timeout passed, or it waits again."""
        held = calls.held
        started = action.started
        arguments = _arguments(started)
        left = event_wait.remaining(started, held.deps.wall_clock())
        if left is not None and left <= event_wait.CLOCK_TOLERANCE:
            outcome = event_wait.timed_out(arguments)
            return await calls.record(seq, started.seq, _call_id(started), event_wait.TOOL, outcome)
        try:
            wait = event_wait.wait_of(arguments, event_wait.run_input(held.entries))
        except ValueError as exc:
            outcome = Outcome("error", error=str(exc))
            return await calls.record(seq, started.seq, _call_id(started), event_wait.TOOL, outcome)
        step, transition = event_wait.park(held.next_seq(), started.seq, wait, left)
        await held.loop.commit([step], park=transition)
        return "parked"


class Canary:
    """`canary_noop`: the contract canary's no-op, which echoes its nonce (executor/canary.py)."""

    call_class = "internal"

    async def start(
        self,
        calls: Calls,
        started: executor_pb2.NewStep,
        call_id: str,
        arguments: Mapping[str, Any],
    ) -> str | None:
        # Started, then its result: two commits, no provider.
        await calls.held.loop.commit([started], tool_calls=1)
        faults.point("executor.canary.after_tool_started")
        outcome = Outcome("ok", output=canary.tool_output(arguments))
        return await calls.record(started.seq + 1, started.seq, call_id, canary.TOOL, outcome)

    async def resume(self, calls: Calls, action: ResolveUnknown, seq: int) -> str | None:
        # Found started (its executor stopped between the two commits): settled as a wait
        # that is over, which echoes no nonce; the canary model then calls the no-op again.
        return await _woken(calls, action, seq)


class Sleep:
    """`sleep`: the run lets go for some seconds."""

    call_class = "internal"

    async def start(
        self,
        calls: Calls,
        started: executor_pb2.NewStep,
        call_id: str,
        arguments: Mapping[str, Any],
    ) -> str:
        seconds = float(arguments["seconds"])
        # Started and parked in one commit: the run lets go while it sleeps, and
        # the result is written when it wakes (resume).
        park = steps.park(started.seq + 1, "sleep", seconds, f"sleep {seconds:g}s")
        await calls.held.loop.commit(
            [started, park], park=steps.park_transition("sleep", seconds), tool_calls=1
        )
        log.info("run %s parked: sleep %gs", calls.held.run_id, seconds)
        return "parked"

    async def resume(self, calls: Calls, action: ResolveUnknown, seq: int) -> str | None:
        return await _woken(calls, action, seq)


class SetMetadata:
    """`set_metadata`: the run records its own tags and metadata (issue 45). One commit holds
    the call and its result; the result's output is the run's whole metadata and tags after
    the call, worked out from the log (the input step's, then each earlier ok result's), and
    the control plane copies it onto the run in that commit's transaction
    (0045_orchestration.sql). A resumed run reads the result; nothing is computed again."""

    call_class = "internal"

    async def start(
        self,
        calls: Calls,
        started: executor_pb2.NewStep,
        call_id: str,
        arguments: Mapping[str, Any],
    ) -> None:
        outcome = labelled(calls.held.entries, arguments)
        result = steps.tool_result(
            started.seq + 1,
            started.seq,
            call_id,
            SET_METADATA,
            outcome.status,
            output=outcome.output,
            error=outcome.error,
        )
        await calls.held.loop.commit([started, result], tool_calls=1)

    async def resume(self, calls: Calls, action: ResolveUnknown, seq: int) -> str | None:
        # Never found started alone (one commit holds both); settled as asked, from the log.
        started = action.started
        outcome = labelled(calls.held.entries, _arguments(started))
        return await calls.record(seq, started.seq, _call_id(started), SET_METADATA, outcome)


SET_METADATA = "set_metadata"


def current_labels(entries: list[Entry]) -> tuple[dict[str, Any], list[str]]:
    """The run's metadata and tags as its log says: the last ok set_metadata result's, else
    the input step's."""
    for entry in reversed(entries):
        p = entry.payload
        if entry.seq == 0 or (p.get("tool") == SET_METADATA and p.get("status") == "ok"):
            source = p if entry.seq == 0 else (p.get("output") or {})
            return dict(source.get("metadata") or {}), list(source.get("tags") or [])
    return {}, []


def labelled(entries: list[Entry], arguments: Mapping[str, Any]) -> Outcome:
    """What a set_metadata call comes to: the whole new metadata and tags, or why not."""
    metadata, tags = current_labels(entries)
    patch = arguments.get("metadata") or {}
    added = arguments.get("tags") or []
    try:
        if not isinstance(patch, Mapping):
            raise ValueError("metadata must be a JSON object")
        if not isinstance(added, list) or not all(isinstance(t, str) for t in added):
            raise ValueError("tags must be a list of strings")
        new_tags = run_labels.tags([*tags, *added])
        new_metadata = run_labels.metadata(run_labels.merged(metadata, patch))
    except ValueError as exc:
        return Outcome("error", error=str(exc))
    return Outcome("ok", output={"metadata": new_metadata, "tags": new_tags})


class Unsupported:
    """An internal tool this executor does not carry."""

    call_class = "internal"

    def __init__(self, name: str) -> None:
        self.name = name

    async def start(
        self,
        calls: Calls,
        started: executor_pb2.NewStep,
        call_id: str,
        arguments: Mapping[str, Any],
    ) -> None:
        """Answered at once with an error (nothing started): the model reads why."""
        error = f"internal tool {self.name!r} is not supported"
        result = steps.tool_result(
            started.seq, started.ref_seq, call_id, self.name, "error", error=error
        )
        await calls.held.loop.commit([result])

    async def resume(self, calls: Calls, action: ResolveUnknown, seq: int) -> str | None:
        return await _woken(calls, action, seq)


TOOLS: Mapping[str, InternalTool] = {
    payloads.READ_RESULT: ReadResult(),
    CHILD_TOOL: StartChild(),
    CHILDREN_TOOL: StartChild(),
    signal_wait.TOOL: WaitForSignal(),
    event_wait.TOOL: WaitForEvent(),
    canary.TOOL: Canary(),
    "sleep": Sleep(),
    SET_METADATA: SetMetadata(),
}


def starting(name: str) -> InternalTool:
    """The tool that starts a call of `name`, a tool of the run's with provider "internal"."""
    return TOOLS.get(name) or Unsupported(name)


def resuming(name: str, call_class: str) -> InternalTool | None:
    """The tool that settles a call of `name` found started without a result; None: the
    call is not an internal one, and is resolved by its class like any other."""
    tool = TOOLS.get(name)
    if tool is not None and tool.call_class == call_class:
        return tool
    return Unsupported(name) if call_class == "internal" else None
