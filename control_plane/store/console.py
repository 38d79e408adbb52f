"""What the web console reads and keeps (sql/console.sql): sessions, run search, queue views.

Every read takes the workspace of the signed-in principal; the console never names
another. A session row keeps the SHA-256 of the cookie's token, never the token.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from control_plane.store.db import Pool
from control_plane.store.queries import run
from control_plane.store.runs import Run


@dataclass(frozen=True)
class StoredSession:
    """Who a console session acts as (its token is not kept, only the token's hash)."""

    workspace_id: str
    kind: str  # key | person
    principal: str
    role: str
    credential_id: str
    expires_at: datetime


@dataclass(frozen=True)
class NewSession:
    session_sha256: bytes
    workspace_id: str
    kind: str
    principal: str
    role: str
    credential_id: str
    ttl_seconds: float


async def insert_session(pool: Pool, s: NewSession) -> None:
    await run(pool, "console_session_purge")
    await run(
        pool,
        "console_session_insert",
        session_sha256=s.session_sha256,
        workspace_id=s.workspace_id,
        kind=s.kind,
        principal=s.principal,
        role=s.role,
        credential_id=s.credential_id,
        ttl_seconds=s.ttl_seconds,
    )


async def get_session(pool: Pool, session_sha256: bytes) -> StoredSession | None:
    row = await run(pool, "console_session_get", session_sha256)
    return StoredSession(**dict(row)) if row is not None else None


async def delete_session(pool: Pool, session_sha256: bytes) -> None:
    await run(pool, "console_session_delete", session_sha256)


@dataclass(frozen=True)
class RunFilter:
    """The runs list's filters; None (or empty) leaves one out."""

    status: str | None = None
    agent_id: str | None = None
    trigger_id: str | None = None
    wait_reason: str | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None
    search: str | None = None


@dataclass(frozen=True)
class FoundRun:
    run: Run
    trigger_id: str | None  # the trigger whose event started it


def _filter_params(workspace_id: str, f: RunFilter, reader: str | None) -> dict[str, Any]:
    return {
        "workspace_id": workspace_id,
        "reader": reader,
        "status": f.status,
        "agent_id": f.agent_id,
        "trigger_id": f.trigger_id,
        "wait_reason": f.wait_reason,
        "created_from": f.created_from,
        "created_to": f.created_to,
        "search": f.search,
    }


Cursor = tuple[datetime, uuid.UUID]  # a run's (created_at, run_id): its place in the list


def _found(rows: list[Any]) -> list[FoundRun]:
    return [FoundRun(Run.from_record(r), r["trigger_id"]) for r in rows]


async def search_runs(
    pool: Pool,
    workspace_id: str,
    f: RunFilter,
    limit: int,
    older_than: Cursor | None = None,
    *,
    reader: str | None,
) -> list[FoundRun]:
    """The filtered runs `reader` may see (None: all; control_plane/auth/privacy.py),
    newest first, older than the cursor (from the newest without one)."""
    at_created, at_run_id = older_than if older_than else (None, None)
    rows = await run(
        pool,
        "console_run_search",
        **_filter_params(workspace_id, f, reader),
        at_created=at_created,
        at_run_id=at_run_id,
        limit=limit,
    )
    return _found(rows)


async def search_runs_newer(
    pool: Pool,
    workspace_id: str,
    f: RunFilter,
    limit: int,
    newer_than: Cursor,
    *,
    reader: str | None,
) -> list[FoundRun]:
    """The `limit` filtered runs `reader` may see just newer than the cursor, newest first."""
    rows = await run(
        pool,
        "console_run_search_newer",
        **_filter_params(workspace_id, f, reader),
        at_created=newer_than[0],
        at_run_id=newer_than[1],
        limit=limit,
    )
    return _found(rows)[::-1]


async def run_counts(
    pool: Pool, workspace_id: str, f: RunFilter, *, reader: str | None
) -> dict[str, int]:
    """How many runs `reader` may see the filters (all but status) match, per status."""
    rows = await run(pool, "console_run_counts", **_filter_params(workspace_id, f, reader))
    return {r["status"]: r["runs"] for r in rows}


async def queue_by_agent(pool: Pool, workspace_id: str) -> list[dict[str, Any]]:
    return [dict(r) for r in await run(pool, "console_queue_by_agent", workspace_id)]


async def waits(pool: Pool, workspace_id: str) -> list[dict[str, Any]]:
    return [dict(r) for r in await run(pool, "console_waits", workspace_id)]


async def release_waits(pool: Pool, workspace_id: str, live_seconds: float) -> list[dict[str, Any]]:
    """The workspace's runs pinned to a release none of whose executors is connected."""
    rows = await run(pool, "console_release_waits", workspace_id, live_seconds)
    return [dict(r) for r in rows]


@dataclass(frozen=True)
class AwaitingPerson:
    """An unknown outcome a person must decide: the run and its tool_result step."""

    run_id: uuid.UUID
    agent_id: str
    seq: int
    payload: dict[str, Any]
    step_created_at: datetime


async def awaiting_person(pool: Pool, workspace_id: str, limit: int) -> list[AwaitingPerson]:
    rows = await run(pool, "console_awaiting_person", workspace_id, limit)
    return [
        AwaitingPerson(
            r["run_id"], r["agent_id"], r["seq"], json.loads(r["payload"]), r["step_created_at"]
        )
        for r in rows
    ]


async def chart_rows(
    pool: Pool, workspace_id: str, agent_id: str | None, since: datetime
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Runs started, and finished (with durations, tokens, cost), per UTC hour since `since`."""
    params = {"workspace_id": workspace_id, "agent_id": agent_id, "since": since}
    started = await run(pool, "console_chart_started", **params)
    finished = await run(pool, "console_chart_finished", **params)
    return [dict(r) for r in started], [dict(r) for r in finished]


async def chart_by_agent(pool: Pool, workspace_id: str, since: datetime) -> list[dict[str, Any]]:
    """Per agent since `since`: started, completed, failed, p95 seconds, tokens, cost."""
    rows = await run(pool, "console_chart_by_agent", workspace_id=workspace_id, since=since)
    return [dict(r) for r in rows]


async def sessions(
    pool: Pool, workspace_id: str, limit: int, reader: str | None = None
) -> list[dict[str, Any]]:
    """The newest sessions `reader` may see (None: all; control_plane/auth/privacy.py)."""
    rows = await run(pool, "console_session_list", workspace_id, limit, reader)
    return [dict(r) for r in rows]


async def session_turns(
    pool: Pool, workspace_id: str, session_id: uuid.UUID, limit: int
) -> list[dict[str, Any]]:
    rows = await run(pool, "console_session_turns", workspace_id, session_id, limit)
    return [dict(r) for r in rows]


async def agent_versions(
    pool: Pool, workspace_id: str, agent_id: str, limit: int
) -> list[dict[str, Any]]:
    """An agent's versions, newest first, each spec decoded."""
    rows = await run(pool, "console_agent_versions", workspace_id, agent_id, limit)
    return [{**dict(r), "spec": json.loads(r["spec"])} for r in rows]


async def runs_by_release(pool: Pool, workspace_id: str) -> dict[str | None, int]:
    rows = await run(pool, "console_runs_by_release", workspace_id)
    return {r["release"]: r["runs"] for r in rows}
