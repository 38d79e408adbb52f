"""Refused calls on /metrics (issue 48), counted as commits land: an after-commit effect
(dispatch/pipeline.py; registered in control_plane/server.py), not a branch in the session.

The commit request already counted its refusals (dispatch/requests.py: refused_rules, the
one reader of `refused_by`); a commit is due when it has some, or when it finishes a run
whose earlier commits had some (the run's count comes back with the commit). It counts each refused
call by rule, a run that failed on one (on_refusal: fail), and a run that finished with
refusals by its outcome. A duplicate (a resent commit) was counted when it first landed.
"""

from __future__ import annotations

from agentrun.v1 import run_pb2
from control_plane.dispatch.requests import refused_rules
from control_plane.ground import convert
from control_plane.ops import metrics
from control_plane.store.db import Pool
from control_plane.store.steps import CommitRequest, CommitResult

FINISHED = frozenset({"completed", "failed"})


class RefusalFigures:
    def due(self, req: CommitRequest, result: CommitResult) -> bool:
        """A commit that refused calls, or that finished a run which refused some before."""
        if result.duplicate:
            return False
        return req.refused_calls > 0 or (
            result.refused_calls > 0 and req.transition.status in FINISHED
        )

    async def settle(self, db: Pool, req: CommitRequest, result: CommitResult) -> CommitResult:
        workspace, status = req.workspace_id, req.transition.status
        for rule in refused_rules(req.steps):
            metrics.REFUSED_CALLS.labels(workspace, rule[:64]).inc()
        if status == "failed" and req.refused_calls:
            metrics.REFUSED_RUNS.labels(workspace).inc()
        if status in FINISHED:
            outcome = convert.outcome(status, result.refused_calls, result.tool_calls)
            name = run_pb2.RunOutcome.Name(outcome).removeprefix("RUN_OUTCOME_").lower()
            metrics.RUNS_FINISHED_WITH_REFUSALS.labels(workspace, name).inc()
        return result
