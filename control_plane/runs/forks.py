"""Forks (DBOS's fork, Temporal's reset): rerun a run from a chosen step of its log.

`fork(...)` admits a new run of the source's agent, at the source's version or a newer
one, whose log is the source's log copied up to and including `from_seq`, followed by a
`forked` marker step (the source, the seq and who asked). The executor that claims it
replays that log like any other (executor/replay.py): every copied decision is a decision
already made, every copied result a result already had, so nothing up to the fork point is
asked or sent again, and it goes on from there, asking the model anew when the last
decision's calls are all answered. That is the main case: a fork right after a
tool_result, so the model reads that result again (under a newer version, say).

The fork point must leave no call open. A call whose latest step at the fork point is its
`tool_started` may be in flight or done (the source's executor does not know yet), and a
fork that resolved it would send the request again under the fork's own key: refused with
INVALID_ARGUMENT naming the step, and so are a call held for an approval (the approval is
the source's, never the fork's) and an unknown outcome awaiting a person. We refuse rather
than cut before the call, because a cut would silently ask the model again for a decision
the caller asked to keep. A call of the last decision that was not started at the fork
point is started by the fork (it was never sent at or before that point).

Everything is one transaction: the run and its input step (the one admission shape,
store/admission.py: limits, caps and `started_by` as for StartRun; the source's priority
unless the request names one), the copied steps (epoch 0, as written at admission), the
marker, the counters (step_count, model and tool calls, tokens: what the copied log
consumed, so the fork's limits bound its whole log), and the audit row. The source is untouched and may still be running: its log before `from_seq`
never changes, since steps are append-only.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from control_plane.auth import audit
from control_plane.auth import context as auth_context
from control_plane.ground.config import RunDefaults
from control_plane.ground.errors import InvalidArgument, NotFound
from control_plane.store import agents as agent_store
from control_plane.store import forks as store
from control_plane.store import runs as run_store
from control_plane.store.admission import admission
from control_plane.store.db import Pool, transaction
from control_plane.store.steps import Step

CALL_STEPS = ("tool_started", "tool_result", "approval_requested", "approval_decided")
# The run's own labels call (executor/internal_tools.py SetMetadata).
SET_METADATA = "set_metadata"


@dataclass(frozen=True)
class ForkRequest:
    workspace_id: str
    run_id: uuid.UUID
    from_seq: int
    agent_version: int  # 0: the source's
    priority: int | None = None  # None: the source's


def _payload(step: Step) -> dict[str, Any]:
    data = json.loads(step.payload)
    return data if isinstance(data, dict) else {}


def _open_call(step: Step) -> bool:
    """Whether a call whose latest step is `step` is still open (no settled result)."""
    if step.kind != "tool_result":
        return True  # started (in flight?), held for an approval, or approved but not sent
    payload = _payload(step)
    return payload.get("awaiting") == "human" or payload.get("decision") == "retry"


def fork_point_problem(steps: list[Step], from_seq: int) -> str | None:
    """Why the log `steps` (seq 0..from_seq of the source) cannot be forked after
    `from_seq`, or None. Only the last decision can have open calls: the model is asked
    again only once every call of the decision before is answered."""
    if not steps or steps[-1].seq != from_seq:
        last = steps[-1].seq if steps else -1
        return f"the run has no step {from_seq} (its last step is {last})"
    if steps[-1].kind == "finish":
        return f"step {from_seq} is the run's finish; fork at an earlier step"
    decision = next((s for s in reversed(steps) if s.kind == "model_decision"), None)
    if decision is None:
        return None
    latest: dict[str, Step] = {}
    for step in steps:
        if step.seq > decision.seq and step.kind in CALL_STEPS:
            latest[str(_payload(step).get("call_id", ""))] = step
    for call_id, step in latest.items():
        if _open_call(step):
            tool = _payload(step).get("tool") or call_id
            return (
                f"the call to {tool} ({step.kind} at seq {step.seq}) has no settled result "
                f"at or before step {from_seq}, and a fork never sends a call again: fork at "
                f"its result, or at step {decision.seq - 1} to have the model decide again"
            )
    return None


async def _version(pool: Pool, source: run_store.Run, wanted: int) -> Any:
    """The agent version the fork runs: the source's, or the newer one asked for."""
    if wanted and wanted < source.agent_version:
        raise InvalidArgument(
            "agent_version",
            f"must be the source run's version ({source.agent_version}) or newer, not {wanted}",
        )
    version = await agent_store.get_version(
        pool, source.workspace_id, source.agent_id, wanted or source.agent_version
    )
    if version is None:
        raise NotFound(f"agent {source.agent_id!r} has no version {wanted}")
    return version


def labels_at(steps: list[Step]) -> tuple[list[str] | None, str | None]:
    """The tags and metadata (JSON text) the copied log says: the last ok set_metadata
    result's, else the input step's; None when none (0045_orchestration.sql)."""
    for step in reversed(steps):
        payload = _payload(step)
        ok = payload.get("tool") == SET_METADATA and payload.get("status") == "ok"
        if step.seq == 0 or (step.kind == "tool_result" and ok):
            source = payload if step.seq == 0 else (payload.get("output") or {})
            tags, metadata = source.get("tags"), source.get("metadata")
            return (list(tags) or None) if isinstance(tags, list) else None, (
                json.dumps(metadata) if isinstance(metadata, dict) and metadata else None
            )
    return None, None


async def fork(
    pool: Pool, defaults: RunDefaults, req: ForkRequest, audited: bool = True
) -> run_store.Run:
    """Admit the fork `req` asks for (queued), or raise a DomainError and write nothing.
    `audited`: False for a bulk action's forks, which the action's one entry covers."""
    source = await run_store.get_run(pool, req.workspace_id, req.run_id)
    if source is None:
        raise NotFound(f"run {req.run_id} not found")
    steps = await store.source_steps(pool, req.workspace_id, req.run_id, req.from_seq)
    if problem := fork_point_problem(steps, req.from_seq):
        raise InvalidArgument("from_seq", problem)
    version = await _version(pool, source, req.agent_version)
    who = auth_context.current().label
    tags, metadata = labels_at(steps)
    adm = admission(
        version,
        defaults,
        source.input,
        started_by=who,
        input_payload=_payload(steps[0]),
        priority=source.priority if req.priority is None else req.priority,
        tags=tags,
        metadata=metadata,
    )
    marker = {
        "from_run_id": str(source.run_id),
        "from_seq": req.from_seq,
        "forked_by": who,
        "agent_version": adm.agent_version,
        "source_agent_version": source.agent_version,
    }
    async with transaction(pool) as conn:
        forked = await store.admit_fork(conn, adm, source.run_id, req.from_seq, marker)
        if not audited:
            return forked
        await audit.record(
            conn,
            "run.forked",
            "run",
            str(forked.run_id),
            {
                "from_run_id": str(source.run_id),
                "from_seq": req.from_seq,
                "agent_version": adm.agent_version,
            },
        )
    return forked
