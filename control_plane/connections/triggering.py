"""The triggering account": a tool that acts as the connection the run's event came in through.

An agent version's `connections` map may name, for a provider, the sentinel `trigger`
(exactly that word, lowercase) instead of a connection id. A run records the connection its
event came in through in its input step, as `trigger_connection_id` (StartRun's field of that
name today; a trigger that receives events through a connected account sets the same field
when it admits the run). The executor resolves the sentinel at call time from the input step;
a run without a triggering connection gets the call's error result, and nothing is sent
(executor/tools/credentials.py). GetConnectionToken hands out the token only for the run's own
triggering connection (store/sql/connections.sql, connection_lease_allows).
"""

from __future__ import annotations

from control_plane.ground import validate
from control_plane.ground.errors import InvalidArgument
from control_plane.store import connections as store
from control_plane.store.db import Pool

TRIGGER = "trigger"
INPUT_FIELD = "trigger_connection_id"


def check_mapping(field: str, value: str) -> str:
    """A `connections` value: a connection id, or the sentinel `trigger`."""
    if value == TRIGGER:
        return value
    return str(validate.run_id(field, value))


async def input_payload(
    pool: Pool, workspace_id: str, text: str, connection_id: str
) -> dict[str, str] | None:
    """The input step of a run that came in through `connection_id` (None: through none)."""
    if not connection_id:
        return None
    cid = str(validate.run_id(INPUT_FIELD, connection_id))
    if await store.get(pool, workspace_id, cid) is None:
        raise InvalidArgument(INPUT_FIELD, f"names no connection of this workspace: {cid}")
    return {"text": text, INPUT_FIELD: cid}
