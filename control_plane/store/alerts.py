"""Alert rules (store/sql/alerts.sql): what each rule watches and when it last fired."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from control_plane.store.db import Record
from control_plane.store.queries import run


@dataclass(frozen=True)
class NewRule:
    workspace_id: str
    name: str
    channel_id: uuid.UUID
    recipient: str
    kind: str  # failure_rate | stuck_on_person
    agent_id: str | None
    window_seconds: int = 0
    min_finished: int = 0
    threshold: float = 0.0
    waiting_seconds: int = 0


async def insert(db: Any, rule: NewRule) -> Record | None:
    """The new rule with its channel's name; None when the name is taken."""
    return await run(
        db,
        "alert_insert",
        workspace_id=rule.workspace_id,
        rule_name=rule.name,
        channel_id=rule.channel_id,
        recipient=rule.recipient,
        kind=rule.kind,
        agent_id=rule.agent_id,
        window_seconds=rule.window_seconds,
        min_finished=rule.min_finished,
        threshold=rule.threshold,
        waiting_seconds=rule.waiting_seconds,
    )


async def list_all(db: Any, workspace_id: str) -> list[Record]:
    return list(await run(db, "alert_list", workspace_id=workspace_id))


async def delete(db: Any, workspace_id: str, name: str) -> bool:
    return await run(db, "alert_delete", workspace_id=workspace_id, rule_name=name) is not None


async def evaluate(db: Any, limit: int) -> list[Record]:
    """Up to `limit` rules of any workspace, each with what it sees now and `breached`."""
    return list(await run(db, "alert_evaluate", limit=limit))


async def fire(db: Any, workspace_id: str, name: str) -> Record | None:
    """Mark the rule fired for this breach; None if it already fired for it."""
    return await run(db, "alert_fire", workspace_id=workspace_id, rule_name=name)


async def resolve(db: Any, workspace_id: str, name: str) -> bool:
    """The breach is over; whether the rule was firing."""
    return await run(db, "alert_resolve", workspace_id=workspace_id, rule_name=name) is not None
