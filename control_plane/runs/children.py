"""Child runs: a `start_child` call admits another agent's run with the parent's park.

The executor commits the call's tool_started step and a park (wait_reason "child", no wake
time) in one commit; here (StartChild, an effect of the commit pipeline: dispatch/
pipeline.py), in that commit's transaction, the child run is admitted through
the one admission path (store/admission.py, the run_admit fragment) and marked with its
parent and the call's seq. A resent commit is a duplicate and admits nothing; the unique
(workspace, parent_run_id, parent_seq) is the backstop. The child's end reaches the parent
through the trigger of migrations/0013_child_runs.sql, which also says why exactly once.

The parent waits per call: it starts one child, waits for its result, then goes on (three
start_child calls run their children one after another). A child runs at its parent's
priority (start_child has no priority of its own).
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
WAIT_REASON = "child"


@dataclass(frozen=True)
class ChildCall:
    seq: int
    agent_id: str
    input: str


def child_call(req: step_store.CommitRequest) -> ChildCall | None:
    """The start_child call this commit parks on, if it is one."""
    t = req.transition
    if t.status != "waiting" or t.wait_reason != WAIT_REASON:
        return None
    for step in req.steps:
        if step.kind != "tool_started":
            continue
        payload = json.loads(step.payload_json)
        if payload.get("tool") == TOOL:
            args = payload.get("arguments") or {}
            return ChildCall(step.seq, str(args.get("agent_id", "")), str(args.get("input", "")))
    return None


class StartChild:
    """The effect of a park for WAIT_REASON (registered in control_plane/server.py)."""

    def __init__(self, defaults: RunDefaults) -> None:
        self._defaults = defaults

    async def prepare(self, db: Pool, req: step_store.CommitRequest, msg: pb.Commit) -> Work | None:
        """Admit the child of the start_child call the run parks on; None if it is none."""
        call = child_call(req)
        return None if call is None else Work(functools.partial(self._start, req, call))

    async def _start(
        self, req: step_store.CommitRequest, call: ChildCall, conn: Connection
    ) -> bool:
        """A child that cannot be admitted (no such agent, bad input) is the call's error
        result at once, and the parent wakes: either way a run is runnable."""
        refusal = await _admit(conn, req, call, self._defaults)
        if refusal is not None:
            await run(conn, "child_refused", req.workspace_id, req.run_id, call.seq, refusal)
        return True


async def _admit(
    conn: Any, req: step_store.CommitRequest, call: ChildCall, defaults: RunDefaults
) -> str | None:
    """Admit the child run; the reason it cannot be, or None."""
    if not call.input or len(call.input.encode()) > MAX_INPUT_BYTES:
        return f"input must be 1 to {MAX_INPUT_BYTES} bytes"
    version = await agent_store.get_version(conn, req.workspace_id, call.agent_id, 0)
    if version is None:
        return f"agent {call.agent_id!r} has no published version"
    parent = await run_store.get_run(conn, req.workspace_id, req.run_id)
    adm = admission(
        version,
        defaults,
        call.input,
        started_by=f"run:{req.run_id}",
        request_id=f"child:{req.run_id}:{call.seq}",
        priority=parent.priority if parent is not None else 0,
    )
    row = await run(conn, "child_admit", **adm.params(None))
    if row is not None:
        await run(conn, "child_mark", req.workspace_id, row["run_id"], req.run_id, call.seq)
    return None


async def child_ids(pool: Pool, workspace_id: str, run_id: Any) -> list[str]:
    """A run's child runs, in the order their calls were made (runs_children)."""
    return [str(r["run_id"]) for r in await run(pool, "runs_children", workspace_id, run_id)]
