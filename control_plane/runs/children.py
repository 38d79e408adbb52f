"""Child runs: a `start_child` call admits another agent's run with the parent's park.

The executor commits the call's tool_started step and a park (wait_reason "child", no wake
time) in one commit; here (StartChild, an effect of the commit pipeline: dispatch/
pipeline.py), in that commit's transaction, the child run is admitted through
the one admission path (store/admission.py, the run_admit fragment) and marked with its
parent and the call's seq. A resent commit is a duplicate and admits nothing; the unique
(workspace, parent_run_id, parent_seq) is the backstop. The child's end reaches the parent
through the trigger of migrations/0013_child_runs.sql, which also says why exactly once.

The parent waits per call: it starts one child, waits for its result, then goes on (three
start_child calls in three decisions run their children one after another). Several
start_child calls of one decision are started in one commit (executor/internal_tools.py):
their children are admitted together and run at once, each call gets its own result as
its child ends, and the parent wakes when the last has (0048_fan_out.sql). A child runs at
its parent's priority (start_child has no priority of its own).

Fan-out (StartChildren, issue 45): one `start_children` call lists several children; the
same park admits them all in that one transaction (all or none: an entry that cannot be
admitted is the call's error result and nothing is admitted), they run in parallel under
the workspace's and agents' caps, and the call's one result, every child's outcome in
list order, wakes the parent once all, the first or n of them ended (the call's `wait`;
migrations/0048_fan_out.sql). Each call says what its parent's close does to its open
children (`parent_close`: cancel, the default, abandon or finish); a start_child call too.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from agentrun.v1 import executor_pb2 as pb
from control_plane.dispatch.pipeline import Work
from control_plane.ground.config import RunDefaults
from control_plane.store import agents as agent_store
from control_plane.store import runs as run_store
from control_plane.store import steps as step_store
from control_plane.store.admission import MAX_INPUT_BYTES, admission
from control_plane.store.db import Connection, Pool
from control_plane.store.queries import run

TOOL = "start_child"
FAN_TOOL = "start_children"
WAIT_REASON = "child"
# What a parent's close does to a child still open: cancel it (the default), abandon it
# (it runs on, detached) or let it finish (the same for now: the parent does not wait).
CLOSE_POLICIES = ("cancel", "abandon", "finish")
WAIT_MODES = ("all", "first", "n")
# Children of one start_children call, at most (the catalogue's maxItems says the same).
MAX_FAN_OUT = 100


@dataclass(frozen=True)
class ChildCall:
    seq: int
    agent_id: str
    input: str
    parent_close: str = "cancel"


def child_calls(req: step_store.CommitRequest) -> list[ChildCall]:
    """The start_child calls this commit parks on: one, or several of one decision (the
    executor starts the start_child calls that follow each other in a decision together)."""
    t = req.transition
    if t.status != "waiting" or t.wait_reason != WAIT_REASON:
        return []
    found = []
    for step in req.steps:
        if step.kind != "tool_started":
            continue
        payload = json.loads(step.payload_json)
        if payload.get("tool") == TOOL:
            args = payload.get("arguments") or {}
            found.append(
                ChildCall(
                    step.seq,
                    str(args.get("agent_id", "")),
                    str(args.get("input", "")),
                    str(args.get("parent_close") or "cancel"),
                )
            )
    return found


class StartChild:
    """The effect of a park for WAIT_REASON (registered in control_plane/server.py)."""

    def __init__(self, defaults: RunDefaults) -> None:
        self._defaults = defaults

    async def prepare(self, db: Pool, req: step_store.CommitRequest, msg: pb.Commit) -> Work | None:
        """Admit the child of each start_child call the run parks on; None if there is none."""
        found = child_calls(req)
        return Work(functools.partial(self._start, req, found)) if found else None

    async def _start(
        self, req: step_store.CommitRequest, found: list[ChildCall], conn: Connection
    ) -> bool:
        """A child that cannot be admitted (no such agent, bad input) is the call's error
        result at once (the parent wakes once every call has its result): either way a run
        is runnable."""
        for call in found:
            refusal = await _admit(conn, req, call, self._defaults)
            if refusal is not None:
                await run(conn, "child_refused", req.workspace_id, req.run_id, call.seq, refusal)
        return True


async def _admit(
    conn: Any, req: step_store.CommitRequest, call: ChildCall, defaults: RunDefaults
) -> str | None:
    """Admit the child run; the reason it cannot be, or None."""
    if call.parent_close not in CLOSE_POLICIES:
        return f"parent_close must be one of {', '.join(CLOSE_POLICIES)}"
    refusal, version = await _version(conn, req, call.agent_id, call.input)
    if refusal is not None:
        return refusal
    priority = await _priority(conn, req)
    await _admit_one(
        conn, req, call.seq, None, call.parent_close, version, call.input, defaults, priority
    )
    await _closes(conn, req, call.parent_close)
    return None


async def _closes(conn: Any, req: step_store.CommitRequest, parent_close: str) -> None:
    """Mark the parent, when its close is to cancel the children just admitted."""
    if parent_close == "cancel":
        await run(conn, "child_parent_closes", req.workspace_id, req.run_id)


async def _version(
    conn: Any, req: step_store.CommitRequest, agent_id: str, text: str
) -> tuple[str | None, Any]:
    """The agent version a child of `agent_id` with input `text` runs, or why it cannot."""
    if not text or len(text.encode()) > MAX_INPUT_BYTES:
        return f"input must be 1 to {MAX_INPUT_BYTES} bytes", None
    version = await agent_store.get_version(conn, req.workspace_id, agent_id, 0)
    if version is None:
        return f"agent {agent_id!r} has no published version", None
    return None, version


async def _priority(conn: Any, req: step_store.CommitRequest) -> int:
    parent = await run_store.get_run(conn, req.workspace_id, req.run_id)
    return parent.priority if parent is not None else 0


async def _admit_one(
    conn: Any,
    req: step_store.CommitRequest,
    seq: int,
    index: int | None,
    parent_close: str,
    version: Any,
    text: str,
    defaults: RunDefaults,
    priority: int,
) -> None:
    """Admit one child (input `text`) of the call at `seq` (at `index` of its list) and
    mark it its parent's."""
    adm = admission(
        version,
        defaults,
        text,
        started_by=f"run:{req.run_id}",
        request_id=f"child:{req.run_id}:{seq}" + ("" if index is None else f":{index}"),
        priority=priority,
    )
    row = await run(conn, "child_admit", **adm.params(None))
    if row is not None:
        await run(
            conn,
            "child_mark",
            req.workspace_id,
            row["run_id"],
            req.run_id,
            seq,
            index,
            parent_close,
        )


@dataclass(frozen=True)
class Child:
    agent_id: str
    input: str


@dataclass(frozen=True)
class FanCall:
    """A start_children call: its children in list order, how many it waits for, and what
    its parent's close does to those still open; `refusal`: why it admits nothing."""

    seq: int
    children: tuple[Child, ...]
    wait: str
    n: int | None
    parent_close: str
    refusal: str | None = None


def fan_call(req: step_store.CommitRequest) -> FanCall | None:
    """The start_children call this commit parks on, if it is one."""
    t = req.transition
    if t.status != "waiting" or t.wait_reason != WAIT_REASON:
        return None
    for step in req.steps:
        if step.kind != "tool_started":
            continue
        payload = json.loads(step.payload_json)
        if payload.get("tool") == FAN_TOOL:
            return _fan_call(step.seq, payload.get("arguments") or {})
    return None


def _fan_call(seq: int, args: Any) -> FanCall:
    """The call its arguments describe, with the first thing wrong with them as `refusal`
    (the catalogue's schema checked their shape already; this is the backstop)."""
    raw = args.get("children") if isinstance(args, dict) else None
    entries = raw if isinstance(raw, list) else []
    children = tuple(
        Child(str(e.get("agent_id", "")), str(e.get("input", "")))
        for e in entries
        if isinstance(e, dict)
    )
    wait = str(args.get("wait") or "all") if isinstance(args, dict) else "all"
    n = args.get("n") if isinstance(args, dict) else None
    close = str(args.get("parent_close") or "cancel") if isinstance(args, dict) else "cancel"
    refusal = None
    if not 1 <= len(children) == len(entries) <= MAX_FAN_OUT:
        refusal = f"children must list 1 to {MAX_FAN_OUT} objects with agent_id and input"
    elif wait not in WAIT_MODES:
        refusal = f"wait must be one of {', '.join(WAIT_MODES)}"
    elif wait == "n" and not (isinstance(n, int) and 1 <= n <= len(children)):
        refusal = f"wait n needs n, from 1 to the number of children ({len(children)})"
    elif close not in CLOSE_POLICIES:
        refusal = f"parent_close must be one of {', '.join(CLOSE_POLICIES)}"
    return FanCall(seq, children, wait, n if isinstance(n, int) else None, close, refusal)


class StartChildren:
    """The effect of a park for WAIT_REASON whose call is start_children (registered in
    control_plane/server.py beside StartChild; each finds only its own tool's call)."""

    def __init__(self, defaults: RunDefaults) -> None:
        self._defaults = defaults

    async def prepare(self, db: Pool, req: step_store.CommitRequest, msg: pb.Commit) -> Work | None:
        """Admit every child of the start_children call the run parks on; None: none."""
        call = fan_call(req)
        return None if call is None else Work(functools.partial(self._start, req, call))

    async def _start(self, req: step_store.CommitRequest, call: FanCall, conn: Connection) -> bool:
        """All or none: an entry that cannot be admitted is the call's error result at once
        (naming the entry), nothing is admitted, and the parent wakes."""
        refusal = call.refusal
        versions: list[Any] = []
        for i, child in enumerate(call.children):
            if refusal is not None:
                break
            why, version = await _version(conn, req, child.agent_id, child.input)
            refusal = None if why is None else f"children[{i}]: {why}"
            versions.append(version)
        if refusal is not None:
            await run(conn, "fan_refused", req.workspace_id, req.run_id, call.seq, refusal)
            return True
        priority = await _priority(conn, req)
        for i, (child, version) in enumerate(zip(call.children, versions, strict=True)):
            await _admit_one(
                conn,
                req,
                call.seq,
                i,
                call.parent_close,
                version,
                child.input,
                self._defaults,
                priority,
            )
        await _closes(conn, req, call.parent_close)
        return True


async def closed_with(conn: Pool | Connection, cancelled: run_store.Run) -> list[Any]:
    """The runs the cancel of `cancelled` cancelled with it (its children whose policy is
    cancel, theirs, ...), so that their holders are told at once as CancelRun tells the
    run's own; none when it closes no children (no query then)."""
    if not cancelled.closes_children:
        return []
    rows = await run(conn, "children_closed_with", cancelled.workspace_id, cancelled.run_id)
    return [r["run_id"] for r in rows]


async def child_ids(pool: Pool, workspace_id: str, run_id: Any) -> list[str]:
    """A run's child runs, in the order their calls were made (runs_children)."""
    return [str(r["run_id"]) for r in await run(pool, "runs_children", workspace_id, run_id)]
