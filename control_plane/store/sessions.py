"""Sessions and their turns: each turn is a run the server admits under the session's lock."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from control_plane.store.admission import Admission
from control_plane.store.db import Connection, Pool, Record, transaction
from control_plane.store.lease import Release
from control_plane.store.queries import run
from control_plane.store.runs import Run
from control_plane.store.steps import Step


async def create_session(
    pool: Pool,
    workspace_id: str,
    agent_id: str,
    title: str,
    strategy: str = "reject",
    now: datetime | None = None,
    visibility: str = "workspace",
) -> Record:
    return await run(
        pool,
        "session_insert",
        workspace_id,
        uuid.uuid4(),
        agent_id,
        title,
        now,
        strategy,
        visibility,
    )


async def get_session(pool: Pool | Connection, workspace_id: str, session_id: uuid.UUID) -> Any:
    return await run(pool, "session_get", workspace_id, session_id)


async def lock_session(conn: Connection, workspace_id: str, session_id: uuid.UUID) -> Any:
    """The session row, locked until the transaction ends (None if there is none)."""
    return await run(conn, "session_lock", workspace_id, session_id)


async def list_turns(
    conn: Pool | Connection, workspace_id: str, session_id: uuid.UUID, from_turn: int, limit: int
) -> list[Record]:
    return await run(conn, "session_turns", workspace_id, session_id, from_turn, limit)


async def recent_turns(
    conn: Pool | Connection, workspace_id: str, session_id: uuid.UUID, limit: int
) -> list[Record]:
    """The last `limit` turns, oldest first."""
    rows = await run(conn, "session_turns_recent", workspace_id, session_id, limit)
    return list(reversed(rows))


async def turn_by_request(
    conn: Connection, workspace_id: str, session_id: uuid.UUID, request_id: str
) -> Record | None:
    return await run(conn, "session_turn_by_request", workspace_id, session_id, request_id)


@dataclass(frozen=True)
class TurnAdmission:
    session_id: uuid.UUID
    turn: int
    request_id: str | None  # the turn's (SendMessage) dedupe key
    run: Admission


async def admit_turn(conn: Connection, adm: TurnAdmission, now: datetime | None = None) -> Record:
    """Insert the turn's run, input step and turn row; the caller holds the session lock."""
    return await run(
        conn,
        "session_turn_admit",
        **{**adm.run.params(now), "session_id": adm.session_id},  # the run is the session's
        turn=adm.turn,
        turn_request_id=adm.request_id,
    )


async def lock_unfinished(conn: Connection, workspace_id: str, session_id: uuid.UUID) -> None:
    """Share-lock the unfinished turns' runs (after the session row): see migration 0021."""
    await run(conn, "session_unfinished_lock", workspace_id, session_id)


async def history(
    conn: Connection, workspace_id: str, session_id: uuid.UUID, turn: int
) -> list[dict[str, str]]:
    """The transcript turn `turn` carries (earlier turns, rolled-back ones left out)."""
    row = await run(conn, "session_history", workspace_id, session_id, turn)
    value = row["history"]
    return list(json.loads(value) if isinstance(value, str) else value)


async def park_turn(conn: Connection, workspace_id: str, run_id: uuid.UUID) -> None:
    """An enqueued turn's run waits until the turn before it ends (the trigger wakes it)."""
    await run(conn, "session_turn_park", workspace_id, run_id)


async def mark_ended(
    conn: Connection, workspace_id: str, session_id: uuid.UUID, turn: int, how: str
) -> None:
    await run(conn, "session_turn_mark_ended", workspace_id, session_id, turn, how)


async def fast_lease(
    conn: Connection,
    workspace_id: str,
    run_id: uuid.UUID,
    owner: str,
    lease_seconds: float,
    carried: Sequence[str] | None,
    release: Release | None,
) -> tuple[Run, list[Step], bool] | None:
    """Lease exactly this queued fast-path turn to `owner`, with every check a claim makes
    (sql/sessions.sql fast_path_lease), in a savepoint of the caller's transaction; the run,
    its steps and whether its workspace is metered, or None when the claim's rules say no
    (or a claim has it)."""
    tools = json.dumps(list(carried)) if carried is not None else None
    async with transaction(conn) as tx:
        if await run(tx, "fast_path_lock_workspace", workspace_id) is None:
            return None  # at its cap (or gone)
        # The release routing first, on its own (Citus plans release_share() only alone).
        releases, own, share = None, None, (None, None, None, None)
        if release is not None:
            releases, own, live_seconds, gated = release.params()
            got = await run(tx, "fast_path_routing", own, live_seconds, gated)
            share = (got["lo"], got["hi"], got["reads_from"], got["writes"])
        row = await run(
            tx,
            "fast_path_lease",
            workspace_id,
            run_id,
            owner,
            lease_seconds,
            tools,
            releases,
            own,
            *share,
        )
        if row is None:
            return None
        steps = await run(tx, "steps_for_runs", [workspace_id], [run_id])
    return Run.from_record(row), [Step.of(s) for s in steps], bool(row["metered"])


async def fast_path_lapsed(pool: Pool) -> int:
    """How many fast-path runs hold a lease that lapsed."""
    return int((await run(pool, "fast_path_lapsed"))["lapsed"])


async def list_sessions(
    pool: Pool,
    workspace_id: str,
    agent_id: str,
    after: tuple[datetime, uuid.UUID] | None,
    size: int,
    reader: str | None = None,
) -> list[Any]:
    """A page of the workspace's sessions, newest first, after `after` (created_at, id),
    only those `reader` may see (None: all; control_plane/auth/privacy.py)."""
    after_time, after_id = after if after is not None else (None, None)
    rows = await run(
        pool,
        "sessions_page",
        workspace_id=workspace_id,
        agent_id=agent_id,
        after_time=after_time,
        after_id=after_id,
        page_size=size,
        reader=reader,
    )
    return list(rows)
