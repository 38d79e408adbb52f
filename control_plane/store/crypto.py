"""Workspace data keys as stored: wrapped by the KMS, never in the clear."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeAlias

from control_plane.store.db import Connection, Pool, Record, transaction
from control_plane.store.queries import run

# (new version) -> (KMS key version, wrapped key): how a rotation wraps its new key.
WrapFor: TypeAlias = Callable[[int], Awaitable[tuple[str, bytes]]]


@dataclass(frozen=True)
class StoredDataKey:
    """One version of a workspace's data key, as the KMS wrapped it."""

    workspace_id: str
    version: int
    kms_key_version: str
    wrapped: bytes = field(repr=False)

    @classmethod
    def of(cls, row: Record) -> StoredDataKey:
        return cls(row["workspace_id"], row["version"], row["kms_key_version"], row["wrapped"])


async def current(conn: Pool | Connection, workspace_id: str) -> StoredDataKey | None:
    """The version that seals now (the newest unretired), or None before the first seal."""
    row = await run(conn, "data_key_current", workspace_id)
    return None if row is None else StoredDataKey.of(row)


async def get(conn: Pool | Connection, workspace_id: str, version: int) -> StoredDataKey | None:
    row = await run(conn, "data_key_get", workspace_id, version)
    return None if row is None else StoredDataKey.of(row)


async def insert_first(
    conn: Pool | Connection, workspace_id: str, kms_key_version: str, wrapped: bytes
) -> None:
    """Store version 1 unless another replica already did (then theirs is the key)."""
    await run(conn, "data_key_insert_first", workspace_id, kms_key_version, wrapped)


async def add_next_version(
    pool: Pool, workspace_id: str, wrap: WrapFor, now: datetime | None = None
) -> int | None:
    """Store a new version (wrapped by `wrap(version)`) for new seals and retire the older
    ones, one rotation per workspace at a time; the new version, or None (no workspace)."""
    async with transaction(pool) as conn:
        if await run(conn, "data_key_rotation_lock", workspace_id) is None:
            return None
        version = (await run(conn, "data_key_next_version", workspace_id))["next_version"]
        kms_key_version, wrapped = await wrap(version)
        await run(conn, "data_key_insert", workspace_id, version, kms_key_version, wrapped)
        await run(conn, "data_key_retire_older", workspace_id, version, now)
        return int(version)


async def not_under(pool: Pool, kms_key_version: str, limit: int) -> list[StoredDataKey]:
    """Data keys still wrapped under some other KMS key version."""
    rows = await run(pool, "data_key_not_under", kms_key_version, limit)
    return [StoredDataKey.of(r) for r in rows]


async def rewrap(pool: Pool, old: StoredDataKey, kms_key_version: str, wrapped: bytes) -> bool:
    """Replace `old`'s wrapping; False when someone re-wrapped it first."""
    status = await run(
        pool,
        "data_key_rewrap",
        old.workspace_id,
        old.version,
        old.kms_key_version,
        kms_key_version,
        wrapped,
    )
    return bool(status.endswith(" 1"))


async def summary(pool: Pool) -> list[Record]:
    """(kms_key_version, data_keys, workspaces) rows."""
    return await run(pool, "data_key_summary")
