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


def trigger_rule(rule: Mapping[str, Any] | None, document: Any) -> dict[str, Any] | None:
    """A trigger's concurrency_key rule for one run it starts, with the event the trigger
    received (a webhook's JSON body, a mail's fields), which the run's input only quotes:
    migration 0054's runs_key_compute reads the rule's path there, by run_key_value's rules,
    and keeps the key as the rule's `value` instead of the event."""
    if not rule:
        return None
    return {**rule, "document": json.dumps(document, ensure_ascii=False, default=str)}


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
