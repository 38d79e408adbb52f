"""Bulk actions by filter (issue 45): BulkCancelRuns.

The filter is ListRuns' (RunFilter); only unfinished runs admitted before the action began
match. The action counts them, records itself once in the audit log, then cancels them in
batches of BATCH runs, one transaction per batch, each run exactly as CancelRun cancels it
(store.cancel_run: its finish step, its holder fenced at its next commit or heartbeat, and
the holder on this replica told at once), and streams its progress after each batch. A run
that ends on its own before its batch reaches it is counted as skipped. A caller that closes
the stream stops the action at a batch boundary; what it cancelled stays cancelled.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from agentrun.v1 import run_pb2
from control_plane.api.run_filters import label_filters
from control_plane.auth import audit
from control_plane.auth import context as auth_context
from control_plane.ground import convert, validate
from control_plane.ground.errors import InvalidArgument
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


async def bulk_cancel(
    pool: Pool,
    request: run_pb2.BulkCancelRunsRequest,
    on_cancel: Callable[[str, uuid.UUID], None],
) -> AsyncIterator[run_pb2.BulkCancelRunsResponse]:
    """BulkCancelRuns: the progress after the count, then after each batch."""
    ws = auth_context.workspace(request.workspace_id)
    wanted = matching(request.filter)
    if wanted.empty and not request.all:
        raise InvalidArgument(
            "filter", "is empty: set all to cancel every unfinished run of the workspace"
        )
    reason = validate.text("reason", request.reason, max_bytes=1000) or "cancelled in bulk"
    action_id = str(uuid.uuid4())
    async with transaction(pool) as conn:
        began = (await conn.fetchval("SELECT now()")).astimezone(UTC)
        values = wanted.values(ws, began)
        matched = (await run(conn, "runs_bulk_count", *values))["n"]
        if not request.dry_run:
            detail = {"filter": wanted.described(), "matched": matched, "reason": reason}
            await audit.record(conn, "runs.bulk_cancelled", "bulk_action", action_id, detail)
    progress = run_pb2.BulkCancelRunsResponse(
        action_id=action_id, matched=matched, dry_run=request.dry_run
    )
    if request.dry_run:
        progress.finished = True
        yield progress
        return
    yield progress
    while True:
        async with transaction(pool) as conn:
            batch = [r["run_id"] for r in await run(conn, "runs_bulk_batch", *values, BATCH)]
            cancelled = []
            for run_id in batch:
                if await store.cancel_run(conn, ws, run_id, reason) is not None:
                    cancelled.append(run_id)
        for run_id in cancelled:
            on_cancel(ws, run_id)
        progress.done += len(cancelled)
        progress.skipped += len(batch) - len(cancelled)
        if len(batch) < BATCH:
            # Those the batches missed ended on their own meanwhile.
            progress.skipped = max(progress.skipped, matched - progress.done)
            progress.finished = True
            yield progress
            return
        yield progress
