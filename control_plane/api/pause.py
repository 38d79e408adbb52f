"""Pause and resume (issue 45): a run, an agent's runs, a workspace's queue.

The claim skips a paused run, the runs of a paused agent and a workspace whose queue is paused
(0045_orchestration.sql); runs already running are not touched by an agent or queue pause.
PauseRun of a running run also asks its holder to hand it back at its next step boundary
(Cancel with pause set: the executor finishes the step it is in, commits it, and parks the
run as handed back, executor/run_loop.py request_handoff); parked and paused, the claim
leaves it, so it holds no executor until ResumeRun. A holder connected to this replica is
asked at once; one connected to another replica is asked by that replica at its next
heartbeat (run_heartbeat returns `paused`), and again at each beat until it has parked.
ResumeRun makes it claimable again, due as its wait says.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime

from agentrun.v1 import run_pb2
from control_plane.auth import audit
from control_plane.auth import context as auth_context
from control_plane.ground import convert, validate
from control_plane.ground.errors import FailedPrecondition, NotFound
from control_plane.store import runs as store
from control_plane.store.db import Connection, Pool, transaction
from control_plane.store.queries import run


async def _ended(pool: Pool, ws: str, run_id: uuid.UUID) -> FailedPrecondition | NotFound:
    row = await store.get_run(pool, ws, run_id)
    if row is None:
        return NotFound(f"run {run_id} not found")
    return FailedPrecondition(f"run {run_id} already ended: {row.status}")


async def explain_pause(pool: Pool, row: store.Run, queue: run_pb2.QueuePosition) -> None:
    """GetRun's queue cause of a run that is paused, or whose agent or queue is."""
    if (
        row.paused
        or (await run(pool, "run_held_by_pause", row.workspace_id, row.agent_id))["paused"]
    ):
        queue.cause = run_pb2.QUEUE_WAIT_CAUSE_PAUSED


async def pause_run(
    pool: Pool,
    request: run_pb2.PauseRunRequest,
    on_pause: Callable[[str, uuid.UUID], None],
) -> run_pb2.PauseRunResponse:
    ws = auth_context.workspace(request.workspace_id)
    run_id = validate.run_id("run_id", request.run_id)
    async with transaction(pool) as conn:
        row = store.Run.from_record(r) if (r := await run(conn, "run_pause", ws, run_id)) else None
        if row is not None:
            await audit.record(conn, "run.paused", "run", str(run_id))
    if row is None:
        raise await _ended(pool, ws, run_id)
    if row.status == "running":
        on_pause(ws, run_id)
    return run_pb2.PauseRunResponse(run=convert.run(row))


async def _lower_turn(conn: Connection, ws: str, wake: datetime | None) -> None:
    """Lower the workspace's turn to the earliest wake a resume freed, in its transaction.

    A statement of its own (pause.sql's workspace_lower_wake): inside the resume's
    statement Citus would run the lowering on the shard, where it may not write."""
    if wake is not None:
        await run(conn, "workspace_lower_wake", ws, wake)


async def resume_run(
    pool: Pool, request: run_pb2.ResumeRunRequest, on_runnable: Callable[[], None]
) -> run_pb2.ResumeRunResponse:
    ws = auth_context.workspace(request.workspace_id)
    run_id = validate.run_id("run_id", request.run_id)
    async with transaction(pool) as conn:
        r = await run(conn, "run_resume", ws, run_id)
        if r is not None:
            if r["status"] in ("queued", "waiting"):
                await _lower_turn(conn, ws, r["wake_at"])
            await audit.record(conn, "run.resumed", "run", str(run_id))
    if r is None:  # not paused (or none): resuming it is a no-op
        row = await store.get_run(pool, ws, run_id)
        if row is None:
            raise NotFound(f"run {run_id} not found")
    else:
        row = store.Run.from_record(r)
        on_runnable()
    return run_pb2.ResumeRunResponse(run=convert.run(row))


async def set_queue_paused(
    pool: Pool, request: run_pb2.SetQueuePausedRequest, on_runnable: Callable[[], None]
) -> run_pb2.SetQueuePausedResponse:
    ws = auth_context.workspace(request.workspace_id)
    agent_id = validate.slug("agent_id", request.agent_id) if request.agent_id else None
    action = "queue.paused" if request.paused else "queue.resumed"
    async with transaction(pool) as conn:
        if agent_id is not None:
            r = await run(conn, "agent_set_paused", ws, agent_id, request.paused)
            kind, name = "agent", agent_id
        else:
            r = await run(conn, "workspace_set_queue_paused", ws, request.paused)
            kind, name = "workspace", ws
        if r["found"]:
            if not request.paused:
                await _lower_turn(conn, ws, r["first_wake"])
            await audit.record(conn, action, kind, name)
    if not r["found"]:
        raise NotFound(f"{kind} {name!r} not found")
    if not request.paused:
        on_runnable()
    return run_pb2.SetQueuePausedResponse(paused=request.paused, queued_runs=r["queued_runs"])
