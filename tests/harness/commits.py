"""Commits through the pipeline the server assembles (control_plane/server.py), every
feature's effect registered, for tests that drive one feature's commits at the store."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from agentrun.v1 import executor_pb2
from control_plane.dispatch.pipeline import CommitPipeline
from control_plane.ground.config import ServerConfig
from control_plane.server import commit_pipeline
from control_plane.store import approvals, outbox, steps
from control_plane.store.db import Connection, Pool, transaction


def pipeline(
    db: Pool | Connection, on_runnable: Callable[[], None] = lambda: None
) -> CommitPipeline:
    """The server's pipeline over `db` (a connection: its effects' transactions are
    savepoints of the caller's)."""
    return commit_pipeline(db, ServerConfig(database_url=""), on_runnable)  # type: ignore[arg-type]


async def approval_commit(
    db: Pool, req: steps.CommitRequest, ask: executor_pb2.ApprovalRequest, lease_seconds: float
) -> steps.CommitResult:
    """A commit that asks for an approval, as the executor sends it."""
    msg = executor_pb2.Commit(approval_request=ask)
    return await pipeline(db).commit(req, lease_seconds, msg)


async def signal_commit(
    db: Pool | Connection,
    req: steps.CommitRequest,
    lease_seconds: float,
    on_runnable: Callable[[], None],
) -> steps.CommitResult:
    """A park on a signal, as the executor sends it."""
    return await pipeline(db, on_runnable).commit(req, lease_seconds)


async def commit_with_approval(
    db: Pool,
    req: steps.CommitRequest,
    lease_seconds: float,
    approval: approvals.NewApproval,
    notify: list[outbox.Notification],
    now: datetime | None = None,
) -> steps.CommitResult:
    """What the approval hold writes (approvals/commit.py) for an approval already
    resolved, at a clock the test fixes: the fenced commit, the approval and its
    notifications in one transaction (none of them again for a duplicate)."""
    async with transaction(db) as conn:
        result = await steps.commit(conn, req, lease_seconds, now)
        if not result.duplicate:
            await approvals.insert(conn, approval, notify, now)
    return result
