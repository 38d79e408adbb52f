"""Triggers, their signing secrets, their events, schedules' slots and push cursors."""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeAlias

from control_plane.store.admission import Admission
from control_plane.store.db import Connection, Pool, Record, transaction
from control_plane.store.queries import run

# (secret id) -> the secret sealed for that id: how a rotation seals the secret it adds.
SealFor: TypeAlias = Callable[[int], Awaitable[bytes]]
FIRST_SECRET_ID = 1


@dataclass(frozen=True)
class NewTrigger:
    workspace_id: str
    trigger_id: str
    agent_id: str
    kind: str
    scheme: str | None
    config: dict[str, Any]
    filters: list[dict[str, Any]]
    next_slot_at: datetime | None = None
    next_fire_at: datetime | None = None
    last_history_id: int | None = None


async def create_trigger(
    pool: Pool | Connection,
    new: NewTrigger,
    sealed_secret: bytes | None,
    now: datetime | None = None,
) -> Record | None:
    """The new trigger (with its first secret, id FIRST_SECRET_ID, already sealed for that id),
    or None when the id is taken."""
    async with transaction(pool) as conn:
        row = await run(
            conn,
            "trigger_insert",
            new.workspace_id,
            new.trigger_id,
            new.agent_id,
            new.kind,
            new.scheme,
            json.dumps(new.config),
            json.dumps(new.filters),
            new.next_slot_at,
            new.next_fire_at,
            new.last_history_id,
            now,
        )
        if row is not None and sealed_secret is not None:
            await run(
                conn,
                "trigger_secret_insert",
                new.workspace_id,
                new.trigger_id,
                FIRST_SECRET_ID,
                sealed_secret,
                now,
            )
        return row


async def get_trigger(pool: Pool, workspace_id: str, trigger_id: str) -> Record | None:
    return await run(pool, "trigger_get", workspace_id, trigger_id)


async def list_triggers(
    pool: Pool, workspace_id: str, after: str | None, agent_id: str | None, limit: int
) -> list[Record]:
    return await run(pool, "trigger_list", workspace_id, after, agent_id, limit)


async def set_enabled(
    pool: Pool | Connection, workspace_id: str, trigger_id: str, enabled: bool
) -> Record | None:
    return await run(pool, "trigger_set_enabled", workspace_id, trigger_id, enabled)


async def for_delivery(
    pool: Pool, workspace_id: str, trigger_id: str, now: datetime | None = None
) -> Record | None:
    """An enabled HTTP trigger and its active secrets (newest first: `secret_ids`,
    `sealed_secrets`, `plain_secrets` for rows not sealed yet), or None."""
    return await run(pool, "trigger_for_delivery", workspace_id, trigger_id, now)


async def active_secrets(
    pool: Pool, workspace_id: str, trigger_id: str, now: datetime | None = None
) -> list[Record]:
    """Descriptions (id, created, expires) of the secrets that verify now; never values."""
    return await run(pool, "trigger_secrets_active", workspace_id, trigger_id, now)


async def rotate_secret(
    pool: Pool | Connection,
    workspace_id: str,
    trigger_id: str,
    seal: SealFor,
    grace_seconds: float,
    now: datetime | None = None,
) -> Record | None:
    """Retire the current secret after `grace_seconds` and add the secret `seal(new id)`
    returns sealed; None if no trigger."""
    async with transaction(pool) as conn:
        row = await run(conn, "trigger_lock", workspace_id, trigger_id)
        if row is None:
            return None
        secret_id = (await run(conn, "trigger_secret_next_id", workspace_id, trigger_id))[
            "secret_id"
        ]
        sealed = await seal(secret_id)
        await run(conn, "trigger_secrets_retire", workspace_id, trigger_id, grace_seconds, now)
        await run(conn, "trigger_secret_insert", workspace_id, trigger_id, secret_id, sealed, now)
        return row


async def plaintext_workspaces(conn: Connection | Pool, limit: int) -> list[str]:
    """Up to `limit` workspaces with a secret still in plain text (no lock)."""
    return [
        r["workspace_id"] for r in await run(conn, "trigger_secrets_plaintext_workspaces", limit)
    ]


async def plaintext_secrets(conn: Connection, workspace_id: str, limit: int) -> list[Record]:
    """Up to `limit` of a workspace's secrets still in plain text, locked for the caller's
    transaction."""
    return await run(conn, "trigger_secrets_plaintext", limit, workspace_id)


async def replace_plaintext(
    conn: Connection, workspace_id: str, trigger_id: str, secret_id: int, sealed: bytes
) -> None:
    """Store a plain secret's sealed form and clear the plain value."""
    await run(conn, "trigger_secret_seal", workspace_id, trigger_id, secret_id, sealed)


# --- events -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class EventAdmission:
    """An event to record and the run it starts, unless `reason` says a filter stopped it
    (then `run` is bound but nothing admitted)."""

    workspace_id: str
    trigger_id: str
    dedupe_key: str
    payload: Any
    reason: str | None
    run: Admission
    scheduled_for: datetime | None = None
    chain_depth: int = 0


async def admit_event(
    conn: Pool | Connection, adm: EventAdmission, now: datetime | None = None
) -> Record | None:
    """The new event (its run and input step written with it), or None on a redelivery."""
    assert adm.run.workspace_id == adm.workspace_id
    return await run(
        conn,
        "trigger_event_admit",
        event_id=uuid.uuid4(),
        trigger_id=adm.trigger_id,
        dedupe_key=adm.dedupe_key,
        reason=adm.reason,
        scheduled_for=adm.scheduled_for,
        chain_depth=adm.chain_depth,
        event_payload=json.dumps(adm.payload),
        **adm.run.params(now),
    )


async def event_by_key(
    conn: Pool | Connection, workspace_id: str, trigger_id: str, dedupe_key: str
) -> Record | None:
    return await run(conn, "trigger_event_by_key", workspace_id, trigger_id, dedupe_key)


async def run_chain_depth(conn: Pool | Connection, run_id: uuid.UUID) -> int | None:
    """The chain depth a run was started with by a trigger event, or None (no such event)."""
    row = await run(conn, "trigger_event_run_depth", run_id)
    return None if row is None else row["chain_depth"]


async def list_events(
    pool: Pool,
    workspace_id: str,
    trigger_id: str,
    after: tuple[datetime, uuid.UUID] | None,
    limit: int,
) -> list[Record]:
    """A page of a trigger's events, newest first, after the keyset cursor."""
    received, event_id = after if after else (None, None)
    return await run(
        pool, "trigger_event_list", workspace_id, trigger_id, received, event_id, limit
    )


# --- schedules --------------------------------------------------------------------------------


async def due_schedule_workspaces(pool: Pool, limit: int, now: datetime | None = None) -> list[str]:
    """Up to `limit` workspaces with a schedule due, the longest overdue first (no lock)."""
    return [r["workspace_id"] for r in await run(pool, "schedule_due_workspaces", now, limit)]


async def claim_due_schedules(
    conn: Connection, workspace_id: str, limit: int, now: datetime | None = None
) -> list[Record]:
    """Lock a workspace's due schedules for the caller's transaction; each row carries
    `db_now`."""
    return await run(conn, "schedule_claim_due", now, limit, workspace_id)


async def advance_schedule(
    conn: Connection,
    workspace_id: str,
    trigger_id: str,
    fired_slot: datetime,
    next_slot: datetime,
    next_fire: datetime,
) -> bool:
    """Move the schedule past `fired_slot`; False when someone already had."""
    status = await run(
        conn, "schedule_advance", workspace_id, trigger_id, fired_slot, next_slot, next_fire
    )
    return status.endswith(" 1")


async def postpone_schedule(
    conn: Connection, workspace_id: str, trigger_id: str, slot: datetime, retry_at: datetime
) -> None:
    """Try a slot that failed to fire again at `retry_at` (other schedules go on meanwhile)."""
    await run(conn, "schedule_postpone", workspace_id, trigger_id, slot, retry_at)


# --- push sources -----------------------------------------------------------------------------


async def announce(
    pool: Pool, workspace_id: str, trigger_id: str, history_id: int, now: datetime | None = None
) -> Record | None:
    """Record a notification's history id and queue a fetch if it is new; None if no source."""
    return await run(pool, "push_announce", workspace_id, trigger_id, history_id, now)


async def claim_due_fetches(
    pool: Pool, limit: int, lease_seconds: float, now: datetime | None = None
) -> list[Record]:
    """Up to `limit` push sources with a fetch due, each leased for `lease_seconds`:
    workspace by workspace, the longest waiting first, each claim one statement that names
    its workspace (on Citus: one shard)."""
    rows: list[Record] = []
    for due in await run(pool, "push_due_workspaces", now, limit):
        if len(rows) >= limit:
            break
        left = limit - len(rows)
        rows += await run(pool, "push_claim_due", now, left, lease_seconds, due["workspace_id"])
    return rows


async def advance_push(
    pool: Pool, workspace_id: str, trigger_id: str, history_id: int, now: datetime | None = None
) -> Record | None:
    """Move the cursor to `history_id` once its events committed (never backwards)."""
    return await run(pool, "push_advance", workspace_id, trigger_id, history_id, now)


async def park_push(pool: Pool, workspace_id: str, trigger_id: str, error: str) -> None:
    """Stop fetching a source whose connection cannot be used, saying why on the trigger."""
    await run(pool, "push_park", workspace_id, trigger_id, error[:500])
