"""Forks: a new run admitted with a copy of another run's log up to a step (sql/forks.sql)."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

from control_plane.store.admission import Admission
from control_plane.store.db import Connection, Pool
from control_plane.store.queries import run
from control_plane.store.runs import Run, RunPage
from control_plane.store.steps import Step


async def source_steps(
    conn: Pool | Connection, workspace_id: str, run_id: uuid.UUID, from_seq: int
) -> list[Step]:
    """The source's steps 0..from_seq, in order."""
    rows = await run(conn, "fork_source_steps", workspace_id, run_id, from_seq)
    return Step.of_rows(rows)


async def admit_fork(
    conn: Connection,
    adm: Admission,
    source_run_id: uuid.UUID,
    from_seq: int,
    marker: dict[str, Any],
    now: datetime | None = None,
) -> Run:
    """Admit the fork with its copied log and marker, then name its source and count its
    steps; in the caller's transaction (the two statements commit together)."""
    row = await run(
        conn,
        "fork_admit",
        source_run_id=source_run_id,
        from_seq=from_seq,
        marker=json.dumps(marker),
        **adm.params(now),
    )
    assert row is not None, "a fork has no request_id, so its admission always inserts"
    marked = await run(conn, "fork_mark", adm.workspace_id, row["run_id"], source_run_id, from_seq)
    return Run.from_record(marked)


async def list_forks(
    pool: Pool,
    workspace_id: str,
    source_run_id: uuid.UUID,
    *,
    after: tuple[datetime, uuid.UUID] | None,
    agent_id: str | None,
    status: str | None,
    limit: int,
    reader: str | None,
) -> RunPage:
    """A page of a run's forks `reader` may see (None: all; control_plane/auth/privacy.py),
    newest first, after the keyset cursor."""
    created, run_id = after if after else (None, None)
    rows = await run(
        pool,
        "fork_list",
        workspace_id,
        source_run_id,
        created,
        run_id,
        agent_id,
        status,
        limit + 1,
        reader,
    )
    return RunPage(runs=Run.from_records(rows[:limit]), has_more=len(rows) > limit)
