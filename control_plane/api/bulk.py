"""Bulk actions by filter (issue 45): BulkCancelRuns and BulkRerunRuns.

The filter is ListRuns' (RunFilter); only unfinished runs admitted before the action began
match. The action counts them, records itself once in the audit log, then cancels them in
batches of BATCH runs, one transaction per batch, each run exactly as CancelRun cancels it
(store.cancel_run: its finish step, its holder fenced at its next commit or heartbeat, and
the holder on this replica told at once), and streams its progress after each batch. A run
that ends on its own before its batch reaches it is counted as skipped. A caller that closes
the stream stops the action at a batch boundary; what it cancelled stays cancelled.

A re-run matches runs of any status and forks each from its seq 0 (control_plane/runs/
forks.py, one transaction per fork), its forks never matched by the action itself (they are
admitted after it began). The batches walk the matched runs in creation order by a keyset
cursor, so each run is read once whatever the action does to it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeAlias

from agentrun.v1 import run_pb2
from control_plane.api.run_filters import label_filters
from control_plane.auth import audit, privacy
from control_plane.auth import context as auth_context
from control_plane.ground import convert, validate
from control_plane.ground.config import RunDefaults
from control_plane.ground.errors import DomainError, InvalidArgument
from control_plane.runs import children, forks
from control_plane.store import runs as store
from control_plane.store.db import Pool, transaction
from control_plane.store.queries import run

# Runs per transaction: a batch holds its runs' row locks for one short transaction.
BATCH = 500


@dataclass(frozen=True)
class Matching:
    """A RunFilter, checked: the positional values of runs_bulk_count / runs_bulk_batch."""

    agent_id: str | None
    status: str | None
    created_since: datetime | None
    search: str | None
    metadata: str | None
    tag: str | None

    @property
    def empty(self) -> bool:
        return all(v is None for v in vars(self).values())

    def described(self) -> dict[str, Any]:
        """The filter as the audit log records it."""
        out = {k: v for k, v in vars(self).items() if v is not None}
        if self.created_since is not None:
            out["created_since"] = self.created_since.isoformat()
        return out

    def values(self, workspace_id: str, before: datetime) -> list[Any]:
        return [
            workspace_id,
            self.agent_id,
            self.status,
            self.created_since,
            self.search,
            self.metadata,
            self.tag,
            before,
        ]


def matching(f: run_pb2.RunFilter) -> Matching:
    """The filter's fields checked, each refusal naming its field (filter.<name>)."""
    agent_id = validate.slug("filter.agent_id", f.agent_id) if f.agent_id else None
    status = None
    if f.status:
        if f.status not in convert.STATUS_FROM_PROTO:
            raise InvalidArgument("filter.status", f"unknown status {f.status}")
        status = convert.STATUS_FROM_PROTO[f.status]
    since = None
    if f.HasField("create_after"):
        try:
            since = f.create_after.ToDatetime(UTC)
        except (ValueError, OverflowError):
            raise InvalidArgument("filter.create_after", "is not a valid timestamp") from None
    search = validate.text("filter.search", f.search, max_bytes=200)
    if "\x00" in search:
        raise InvalidArgument("filter.search", "contains a NUL character")
    tag, contains = label_filters(f.tag, f.metadata, where="filter.")
    return Matching(agent_id, status, since, search or None, contains, tag)


# A BulkCancelRunsResponse or a BulkRerunRunsResponse: the same fields.
Progress: TypeAlias = Any
# One batch's work: the runs acted on, of the batch's run ids (the others are skipped).
Act = Callable[[str, list[uuid.UUID]], Awaitable[int]]


async def batches(
    pool: Pool,
    ws: str,
    wanted: Matching,
    unfinished: bool,
    progress: Progress,
    audit_as: tuple[str, dict[str, Any]],
    act: Act,
) -> AsyncIterator[Progress]:
    """Count, audit once, then act on BATCH runs at a time in creation order, yielding the
    progress after the count and after each batch (dry_run: the count only)."""
    reader = privacy.reader()  # read before the first yield: the caller's context
    async with transaction(pool) as conn:
        began = (await conn.fetchval("SELECT now()")).astimezone(UTC)
        # Only the runs the caller sees (control_plane/auth/privacy.py): a private session's
        # runs are neither counted in `matched` nor acted on for one outside it.
        values = [*wanted.values(ws, began), unfinished, reader]
        progress.matched = (await run(conn, "runs_bulk_count", *values))["n"]
        if not progress.dry_run:
            action, detail = audit_as
            detail = {"filter": wanted.described(), "matched": progress.matched, **detail}
            await audit.record(
                conn, action, "bulk_action", progress.action_id, detail, workspace_id=ws
            )
    if progress.dry_run:
        progress.finished = True
        yield progress
        return
    yield progress
    after: tuple[datetime | None, uuid.UUID | None] = (None, None)
    while True:
        rows = await run(pool, "runs_bulk_batch", *values, *after, BATCH)
        if rows:
            after = (rows[-1]["created_at"], rows[-1]["run_id"])
            acted = await act(ws, [r["run_id"] for r in rows])
            progress.done += acted
            progress.skipped += len(rows) - acted
        if len(rows) < BATCH:
            # Those the batches missed ended (or were deleted) meanwhile.
            progress.skipped = max(progress.skipped, progress.matched - progress.done)
            progress.finished = True
            yield progress
            return
        yield progress


def checked_filter(run_filter: run_pb2.RunFilter, every: bool, what: str) -> Matching:
    wanted = matching(run_filter)
    if wanted.empty and not every:
        raise InvalidArgument("filter", f"is empty: set all to {what}")
    return wanted


async def bulk_cancel(
    pool: Pool,
    request: run_pb2.BulkCancelRunsRequest,
    on_cancel: Callable[[str, uuid.UUID], None],
) -> AsyncIterator[Progress]:
    """BulkCancelRuns: each batch in one transaction, each run as CancelRun cancels it."""
    ws = auth_context.workspace(request.workspace_id)
    wanted = checked_filter(
        request.filter, request.all, "cancel every unfinished run of the workspace"
    )
    reason = validate.text("reason", request.reason, max_bytes=1000) or "cancelled in bulk"

    async def cancel(ws: str, run_ids: list[uuid.UUID]) -> int:
        cancelled: list[uuid.UUID] = []
        with_them: list[uuid.UUID] = []  # children a cancelled parent's close cancelled
        async with transaction(pool) as conn:
            for run_id in run_ids:
                row = await store.cancel_run(conn, ws, run_id, reason)
                if row is not None:
                    cancelled.append(run_id)
                    with_them += await children.closed_with(conn, row)
        for run_id in cancelled + with_them:
            on_cancel(ws, run_id)
        return len(cancelled)

    progress = run_pb2.BulkCancelRunsResponse(action_id=str(uuid.uuid4()), dry_run=request.dry_run)
    audit_as = ("runs.bulk_cancelled", {"reason": reason})
    async for p in batches(pool, ws, wanted, True, progress, audit_as, cancel):
        yield p


async def bulk_rerun(
    pool: Pool,
    defaults: RunDefaults,
    request: run_pb2.BulkRerunRunsRequest,
    on_runnable: Callable[[], None],
) -> AsyncIterator[Progress]:
    """BulkRerunRuns: each matched run forked from seq 0 (ForkRun's own path, unaudited:
    the action's one entry covers them)."""
    ws = auth_context.workspace(request.workspace_id)
    wanted = checked_filter(request.filter, request.all, "run every run of the workspace again")

    async def rerun(ws: str, run_ids: list[uuid.UUID]) -> int:
        started = 0
        for run_id in run_ids:
            req = forks.ForkRequest(workspace_id=ws, run_id=run_id, from_seq=0, agent_version=0)
            try:
                await forks.fork(pool, defaults, req, audited=False)
            except DomainError:  # deleted meanwhile, or its version is gone: skipped
                continue
            started += 1
        if started:
            on_runnable()
        return started

    progress = run_pb2.BulkRerunRunsResponse(action_id=str(uuid.uuid4()), dry_run=request.dry_run)
    async for p in batches(pool, ws, wanted, False, progress, ("runs.bulk_rerun", {}), rerun):
        yield p
