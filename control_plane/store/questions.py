"""The questions unknown outcomes ask people (sql/questions.sql, migration 0042)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from control_plane.store.queries import run


@dataclass(frozen=True)
class NewQuestion:
    workspace_id: str
    run_id: uuid.UUID
    seq: int
    tool: str
    recipients: list[str]
    slack_recipients: list[str]
    every_seconds: int
    on_timeout: str  # remind | escalate | fail
    escalate_to: list[str]
    max_reminders: int
    call: dict[str, Any]


@dataclass(frozen=True)
class Question:
    workspace_id: str
    run_id: uuid.UUID
    seq: int
    tool: str
    recipients: list[str]
    slack_recipients: list[str]
    every_seconds: int
    on_timeout: str
    escalate_to: list[str]
    max_reminders: int
    call: dict[str, Any]
    reminders_sent: int
    escalation_level: int
    next_at: datetime
    closed_at: datetime | None
    closed_reason: str | None
    created_at: datetime

    @classmethod
    def of(cls, record: asyncpg.Record | None) -> Question | None:
        if record is None:
            return None
        values = {k: (list(v) if isinstance(v, list) else v) for k, v in record.items()}
        return cls(**{**values, "call": json.loads(record["call"])})


async def insert(
    conn: asyncpg.Connection, q: NewQuestion, now: datetime | None = None
) -> Question | None:
    """The question, or None when this park asked it already (a resent commit)."""
    row = await run(
        conn,
        "question_insert",
        workspace_id=q.workspace_id,
        run_id=q.run_id,
        seq=q.seq,
        tool=q.tool,
        recipients=q.recipients,
        slack_recipients=q.slack_recipients,
        every_seconds=q.every_seconds,
        on_timeout=q.on_timeout,
        escalate_to=q.escalate_to,
        max_reminders=q.max_reminders,
        call_json=json.dumps(q.call),
        now=now,
    )
    return Question.of(row)


async def get(db: Any, workspace_id: str, run_id: uuid.UUID, seq: int) -> Question | None:
    return Question.of(await run(db, "question_get", workspace_id, run_id, seq))


async def close(db: Any, workspace_id: str, run_id: uuid.UUID, seq: int, reason: str) -> None:
    await run(db, "question_close", workspace_id, run_id, seq, reason)


async def due_workspaces(db: Any, limit: int, now: datetime | None = None) -> list[str]:
    return [r["workspace_id"] for r in await run(db, "questions_due_workspaces", limit, now)]


async def lock_due(
    conn: asyncpg.Connection, workspace_id: str, limit: int, now: datetime | None = None
) -> list[Question]:
    rows = await run(conn, "questions_due", limit, now, workspace_id)
    return [q for q in map(Question.of, rows) if q is not None]


async def advance(
    conn: asyncpg.Connection,
    q: Question,
    *,
    recipients: list[str] | None,
    escalate: bool,
    now: datetime | None = None,
) -> Question | None:
    """Remind (recipients None) or escalate to `recipients`: a fresh next_at."""
    row = await run(
        conn,
        "question_advance",
        q.workspace_id,
        q.run_id,
        q.seq,
        recipients,
        int(escalate),
        int(not escalate),
        now,
    )
    return Question.of(row)


async def fail_run(
    conn: asyncpg.Connection, q: Question, error: str, now: datetime | None = None
) -> bool:
    """Fail the run still waiting for `q`'s answer; False when it no longer waits."""
    return await run(conn, "question_fail_run", q.workspace_id, q.run_id, error, now) is not None
