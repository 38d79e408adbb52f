"""The top-up after a commit: a metered run that spent what it reserved reserves the next
chunk before its next step, or stops there (store/sql/credits.sql says why this is never
charged twice).

An after-commit effect (dispatch/pipeline.py), not part of the commit's transaction: the
plain commit stays one statement, its own transaction (the hottest path), and the statement
says whether the run owes (CommitResult.credits_due). A crash between the two is healed by
the retried commit, a duplicate that tops up, or by the next claim, which finds the run
owing (credits/claims.py).
"""

from __future__ import annotations

import faults
from control_plane.store import credits as store
from control_plane.store.db import Pool
from control_plane.store.steps import CommitRequest, CommitResult


class TopUp:
    """Registered after every commit (control_plane/server.py)."""

    def due(self, req: CommitRequest, result: CommitResult) -> bool:
        """A run that goes on and has spent all it reserved; or a duplicate that goes on,
        whose first try may have landed without its top-up (a kill -9 between the two)."""
        return result.status == "running" and (result.credits_due or result.duplicate)

    async def settle(self, db: Pool, req: CommitRequest, result: CommitResult) -> CommitResult:
        # Committed, not topped up: a crash here is healed as the docstring says.
        faults.point("control_plane.credits.before_top_up")
        # A call committed as started is about to be sent: stopping now would make it an
        # unknown outcome. The run goes on overdrawn and stops at its next commit.
        may_stop = not (req.steps and req.steps[-1].kind == "tool_started")
        outcome = await store.reserve(
            db, req.workspace_id, req.run_id, req.epoch, may_stop=may_stop
        )
        if outcome is None or outcome.status == "running":
            return result
        return CommitResult(outcome.status, None, result.duplicate, stopped=outcome.reason)
