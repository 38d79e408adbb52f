"""Connected accounts as stored: sealed tokens, flows in flight, runs parked on them.

Tokens arrive here already sealed (control_plane/connections/tokens.py); nothing in this
module sees a token in the clear.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime

import asyncpg

from control_plane.store.db import Connection, Pool, Record, transaction
from control_plane.store.queries import run

STATUSES = ("active", "expired", "revoked", "needs_reauth")


class RefreshBusy(Exception):
    """Another session held the connection's refresh lock longer than we would wait."""


@dataclass(frozen=True)
class StoredConnection:
    workspace_id: str
    connection_id: str
    provider: str
    account: str
    owner: str
    scopes: tuple[str, ...]
    status: str
    status_reason: str
    access_expires_at: datetime | None
    token_generation: int = 0
    due: bool = False
    access_sealed: bytes | None = field(default=None, repr=False)
    refresh_sealed: bytes | None = field(default=None, repr=False)

    @classmethod
    def of(cls, row: Record) -> StoredConnection:
        keys = set(row.keys())
        return cls(
            workspace_id=row["workspace_id"],
            connection_id=str(row["connection_id"]),
            provider=row["provider"],
            account=row["account"],
            owner=row["owner"],
            scopes=tuple(row["scopes"]),
            status=row["status"],
            status_reason=row["status_reason"],
            access_expires_at=row["access_expires_at"],
            token_generation=row["token_generation"] if "token_generation" in keys else 0,
            due=bool(row["due"]) if "due" in keys else False,
            access_sealed=row["access_sealed"] if "access_sealed" in keys else None,
            refresh_sealed=row["refresh_sealed"] if "refresh_sealed" in keys else None,
        )


@dataclass(frozen=True)
class NewPair:
    """A token pair from the provider, sealed; `refresh_sealed` None keeps the stored one."""

    access_sealed: bytes = field(repr=False)
    refresh_sealed: bytes | None = field(repr=False)
    expires_in: float
    scopes: list[str] | None = None


@dataclass(frozen=True)
class Flow:
    workspace_id: str
    flow_id: str
    provider: str
    owner: str
    scopes: tuple[str, ...]
    verifier_sealed: bytes = field(repr=False)
    connection_id: str | None
    live: bool


async def find(pool: Pool, workspace_id: str, provider: str, account: str) -> str | None:
    row = await run(
        pool, "connection_find", workspace_id=workspace_id, provider=provider, account=account
    )
    return None if row is None else str(row["connection_id"])


async def upsert(
    pool: Pool | Connection,
    workspace_id: str,
    provider: str,
    account: str,
    owner: str,
    pair: NewPair,
    connection_id: str,
) -> tuple[str, bool] | None:
    """Store a finished authorization whose tokens were sealed for `connection_id`;
    (connection id, whether it reconnected one), or None when the account's row has
    another id (a racing callback made it: seal for that one and try again)."""
    row = await run(
        pool,
        "connection_insert",
        workspace_id=workspace_id,
        connection_id=uuid.UUID(connection_id),
        provider=provider,
        account=account,
        owner=owner,
        scopes=pair.scopes or [],
        access_sealed=pair.access_sealed,
        refresh_sealed=pair.refresh_sealed,
        expires_in=float(pair.expires_in),
    )
    if row is None:
        return None
    return str(row["connection_id"]), bool(row["reconnected"])


async def get(
    conn: Pool | Connection, workspace_id: str, connection_id: str, margin: float = 0.0
) -> StoredConnection | None:
    row = await run(
        conn,
        "connection_get",
        workspace_id=workspace_id,
        connection_id=uuid.UUID(connection_id),
        margin=float(margin),
    )
    return None if row is None else StoredConnection.of(row)


async def list_for(pool: Pool, workspace_id: str, limit: int = 100) -> list[StoredConnection]:
    rows = await run(pool, "connection_list", workspace_id=workspace_id, limit=limit)
    return [StoredConnection.of(row) for row in rows]


async def lock_refresh(
    conn: Connection, workspace_id: str, connection_id: str, timeout_seconds: float
) -> None:
    """Take the connection's refresh lock for the rest of `conn`'s transaction, waiting at
    most `timeout_seconds` (then asyncpg's LockNotAvailableError)."""
    await run(conn, "connection_lock_timeout", timeout=f"{int(timeout_seconds * 1000)}ms")
    try:
        await run(
            conn, "connection_refresh_lock", workspace_id=workspace_id, connection_id=connection_id
        )
    except asyncpg.exceptions.LockNotAvailableError:
        raise RefreshBusy(f"refresh of connection {connection_id} is taking too long") from None


async def store_pair(
    pool: Pool, workspace_id: str, connection_id: str, generation: int, pair: NewPair
) -> int | None:
    """Store a refreshed pair over `generation`; the new generation, or None (stale)."""
    row = await run(
        pool,
        "connection_store_pair",
        workspace_id=workspace_id,
        connection_id=uuid.UUID(connection_id),
        generation=generation,
        access_sealed=pair.access_sealed,
        refresh_sealed=pair.refresh_sealed,
        expires_in=float(pair.expires_in),
        scopes=pair.scopes,
    )
    return None if row is None else int(row["token_generation"])


async def set_status(
    pool: Pool | Connection, workspace_id: str, connection_id: str, status: str, reason: str
) -> Record | None:
    """Mark a connection (its tokens dropped unless active); the row if it changed."""
    return await run(
        pool,
        "connection_set_status",
        workspace_id=workspace_id,
        connection_id=uuid.UUID(connection_id),
        status=status,
        reason=reason,
    )


async def insert_flow(pool: Pool, state_sha256: bytes, flow: Flow, ttl_seconds: float) -> None:
    await run(
        pool,
        "connection_flow_insert",
        state_sha256=state_sha256,
        workspace_id=flow.workspace_id,
        flow_id=uuid.UUID(flow.flow_id),
        provider=flow.provider,
        owner=flow.owner,
        scopes=list(flow.scopes),
        verifier_sealed=flow.verifier_sealed,
        connection_id=uuid.UUID(flow.connection_id) if flow.connection_id else None,
        ttl=float(ttl_seconds),
    )


async def take_flow(pool: Pool, state_sha256: bytes) -> Flow | None:
    """The flow a state names, consumed; None if unknown."""
    row = await run(pool, "connection_flow_take", state_sha256=state_sha256)
    if row is None:
        return None
    cid = row["connection_id"]
    return Flow(
        workspace_id=row["workspace_id"],
        flow_id=str(row["flow_id"]),
        provider=row["provider"],
        owner=row["owner"],
        scopes=tuple(row["scopes"]),
        verifier_sealed=row["verifier_sealed"],
        connection_id=str(cid) if cid else None,
        live=bool(row["live"]),
    )


async def wake_waiting(pool: Pool, workspace_id: str, connection_id: str) -> list[str]:
    """Every run parked on the connection, made runnable now; their ids."""
    async with transaction(pool) as conn:
        rows = await run(
            conn,
            "connection_wake_waiting",
            workspace_id=workspace_id,
            connection_id=uuid.UUID(connection_id),
        )
    return [str(row["run_id"]) for row in rows]


async def lease_allows(
    pool: Pool, workspace_id: str, run_id: str, epoch: int, connection_id: str
) -> bool:
    """Whether the run is held under `epoch` and its agent version names the connection."""
    row = await run(
        pool,
        "connection_lease_allows",
        workspace_id=workspace_id,
        run_id=uuid.UUID(run_id),
        epoch=epoch,
        connection_id=connection_id,
    )
    return row is not None


async def mark_broken(
    conn: Connection, workspace_id: str, connection_id: str, reason: str
) -> Record | None:
    """A run waits on the connection; the row the first time since it last worked."""
    return await run(
        conn,
        "connection_mark_broken",
        workspace_id=workspace_id,
        connection_id=uuid.UUID(connection_id),
        reason=reason[:500],
    )


async def mark_stale(pool: Pool, workspace_id: str, connection_id: str, generation: int) -> None:
    """The provider refused generation `generation`'s access token: make it due for refresh."""
    await run(
        pool,
        "connection_mark_stale",
        workspace_id=workspace_id,
        connection_id=uuid.UUID(connection_id),
        generation=generation,
    )
