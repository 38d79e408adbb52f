"""Private sessions' membership and the visibility checks (sql/privacy.sql, migration 0051)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from control_plane.store.db import Connection, Pool
from control_plane.store.queries import run


async def session_hidden(
    pool: Pool | Connection, workspace_id: str, session_id: uuid.UUID, reader: str | None
) -> bool | None:
    """Whether `reader` may not see the session (None: there is no such session)."""
    row = await run(pool, "privacy_session_hidden", workspace_id, session_id, reader)
    return None if row is None else bool(row["hidden"])


async def run_hidden(
    pool: Pool | Connection, workspace_id: str, run_id: uuid.UUID, reader: str | None
) -> bool:
    """Whether the run is a turn (or a turn's child) of a private session `reader` is not
    a member of."""
    if reader is None:
        return False
    row = await run(pool, "privacy_run_hidden", workspace_id, run_id, reader)
    return bool(row["hidden"])


async def add_members(
    conn: Pool | Connection,
    workspace_id: str,
    session_id: uuid.UUID,
    members: Sequence[str],
    added_by: str | None,
) -> None:
    if members:
        await run(conn, "session_members_add", workspace_id, session_id, list(members), added_by)


async def remove_members(
    conn: Pool | Connection, workspace_id: str, session_id: uuid.UUID, members: Sequence[str]
) -> None:
    if members:
        await run(conn, "session_members_remove", workspace_id, session_id, list(members))


async def set_visibility(
    conn: Pool | Connection, workspace_id: str, session_id: uuid.UUID, visibility: str
) -> None:
    await run(conn, "session_visibility_set", workspace_id, session_id, visibility)


async def members(pool: Pool | Connection, workspace_id: str, session_id: uuid.UUID) -> list[str]:
    row = await run(pool, "session_members_of", workspace_id, session_id)
    return list(row["members"])
