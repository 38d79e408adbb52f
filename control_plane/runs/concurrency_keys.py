"""Keyed concurrency (issue 45, item 3): what GetRun says of a run waiting for a key's slot.

The slots themselves are kept by the database, around the claim: migration 0050's triggers
take one at admission (or park the run with wait_reason "concurrency_key"), and pass it to
the key's next waiter or free it when a holder ends, by whatever path it ends. Nothing here
is on the claim's or the commit's path.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from agentrun.v1 import run_pb2
from control_plane.store import runs as store
from control_plane.store.db import Pool
from control_plane.store.queries import run

WAIT_REASON = "concurrency_key"
MAX_KEY_CHARS = 200  # as run_key_value (migration 0050) keeps


def key_value(document: Any, path: list[str]) -> str:
    """A key by run_key_value's rules, read from a document instead of a run's input: the
    value at `path` (a string as it is, any other value as its JSON text, the first 200
    characters), or '' when the document is no object or has nothing (or null) there."""
    node = document
    for name in path:
        if not isinstance(node, Mapping) or name not in node:
            return ""
        node = node[name]
    if node is None:
        return ""
    return (node if isinstance(node, str) else json.dumps(node, ensure_ascii=False))[:MAX_KEY_CHARS]


def trigger_rule(rule: Mapping[str, Any] | None, document: Any) -> dict[str, Any] | None:
    """A trigger's concurrency_key rule for one run it starts, its key read from the event
    the trigger received (a webhook's JSON body, a mail's fields), which the run's input
    only quotes: `value` is the run's key (migration 0054's admission takes it as is)."""
    if not rule:
        return None
    return {**rule, "value": key_value(document, list(rule.get("path") or []))}


async def queue_position(pool: Pool, ws: str, run_id: uuid.UUID) -> run_pb2.QueuePosition | None:
    """The queue place of a run waiting for its key's slot (None if it is not waiting so):
    runs_ahead counts the key's waiters that get a slot first."""
    row = await run(pool, "run_key_position", ws, run_id)
    if row is None:
        return None
    return run_pb2.QueuePosition(
        runs_ahead=row["runs_ahead"], cause=run_pb2.QUEUE_WAIT_CAUSE_CONCURRENCY_KEY
    )


async def as_admitted(pool: Pool, row: store.Run) -> store.Run:
    """A freshly admitted run as it now is: a keyed one may have been parked for its key's
    slot after the insert returned it (migration 0050's trigger), and StartRun says so."""
    if row.concurrency_key is None:
        return row
    return await store.get_run(pool, row.workspace_id, row.run_id) or row
