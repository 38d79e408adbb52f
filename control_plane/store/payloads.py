"""Payloads: large tool results stored apart from the step log (migrations/0010_payloads.sql)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import faults
from control_plane.store.db import Connection, Pool, transaction
from control_plane.store.errors import Fenced
from control_plane.store.lease import LeaseKey
from control_plane.store.queries import run


@dataclass(frozen=True)
class Chunk:
    sha256: str
    size: int
    media_type: str
    offset: int
    data: bytes


@dataclass(frozen=True)
class Stored:
    """Where an upload stands: bytes received so far, whole or not, and whether the
    chunk was out of order (its offset is past what arrived) or the bytes did not hash
    to the payload's name (the upload starts again from 0)."""

    received: int
    complete: bool
    gap: bool = False
    mismatch: bool = False


@dataclass(frozen=True)
class Slice:
    data: bytes
    size: int
    media_type: str


async def _check_held(conn: Connection, lease: LeaseKey) -> None:
    row = await run(conn, "payload_lease_held", lease.workspace_id, lease.run_id, lease.epoch)
    if not row["held"]:
        raise Fenced(f"run {lease.run_id} is not held under epoch {lease.epoch}")


async def put_chunk(pool: Pool, lease: LeaseKey, chunk: Chunk) -> Stored:
    """Append one chunk under a held lease; the completing one checks the hash."""
    ws, sha = lease.workspace_id, chunk.sha256
    async with transaction(pool) as conn:
        await _check_held(conn, lease)
        await run(conn, "payload_lock", ws, sha)
        if await run(conn, "payload_get", ws, sha) is not None:
            return Stored(chunk.size, True)  # already whole (a retry, or the same bytes)
        received = (await run(conn, "payload_received", ws, sha))["received"]
        if chunk.offset > received:
            return Stored(received, False, gap=True)
        if chunk.offset == received and chunk.data:
            await run(conn, "payload_chunk_insert", ws, sha, chunk.offset, chunk.data)
            received += len(chunk.data)
        if received < chunk.size:
            return Stored(received, False)
        digest = hashlib.sha256()
        for row in await run(conn, "payload_chunks_all", ws, sha):
            digest.update(row["data"])
        if digest.hexdigest() != sha:
            await run(conn, "payload_chunks_forget", ws, sha)
            return Stored(0, False, mismatch=True)
        await run(conn, "payload_complete", ws, sha, chunk.size, chunk.media_type, lease.run_id)
        faults.point("control_plane.payload.after_complete")
        return Stored(chunk.size, True)


async def get_slice(pool: Pool, lease: LeaseKey, sha256: str, offset: int, length: int) -> Slice:
    """Bytes [offset, offset + length) of a whole payload of the lease's workspace.

    Raises LookupError when the workspace has no such (whole) payload."""
    ws = lease.workspace_id
    async with transaction(pool) as conn:
        await _check_held(conn, lease)
        row = await run(conn, "payload_get", ws, sha256)
        if row is None:
            raise LookupError(sha256)
        chunks = await run(conn, "payload_chunks_between", ws, sha256, offset, length)
    data = b"".join(bytes(c["data"]) for c in chunks)
    start = offset - chunks[0]["offset"] if chunks else 0
    return Slice(data[start : start + length], row["size"], row["media_type"])
