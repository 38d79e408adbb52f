"""Trigger signing secrets, sealed at rest with the workspace's data key.

Every secret is sealed on write (purpose "trigger_secret", object "<trigger_id>/<secret_id>"),
so a sealed value copied to another trigger, secret id or workspace does not open. Webhook
verification opens the active ones per delivery: with the data key cached in the envelope
that is one AES-GCM decryption per secret, no KMS call and no extra query; plain secrets
are never cached.

Rows written before sealing existed (migration 0008) are sealed by `backfill`, which every
control plane runs at startup before it serves: it seals each plain value and clears it in
the same statement, a batch per transaction, skipping rows another replica is sealing. Until
then `for_delivery` still verifies with a row's plain value, so a delivery during the upgrade
is not refused. (Postgres keeps the old row versions until VACUUM, and backups and WAL keep
theirs: rotate secrets after the upgrade where that matters.)
"""

from __future__ import annotations

import logging
from typing import Any

from control_plane.crypto.envelope import TRIGGER_SECRET, Envelope
from control_plane.store import triggers as store

log = logging.getLogger(__name__)


def object_id(trigger_id: str, secret_id: int) -> str:
    """What a trigger secret's ciphertext is bound to besides its workspace."""
    return f"{trigger_id}/{secret_id}"


async def seal(
    envelope: Envelope, workspace_id: str, trigger_id: str, secret_id: int, secret: str
) -> bytes:
    return await envelope.seal(
        workspace_id, TRIGGER_SECRET, object_id(trigger_id, secret_id), secret.encode()
    )


async def create(
    pool: store.Pool, envelope: Envelope, new: store.NewTrigger, secret: str | None
) -> store.Record | None:
    """The new trigger with its first secret sealed, or None when the id is taken."""
    sealed = None
    if secret is not None:
        sealed = await seal(
            envelope, new.workspace_id, new.trigger_id, store.FIRST_SECRET_ID, secret
        )
    return await store.create_trigger(pool, new, sealed)


async def rotate(
    pool: store.Pool,
    envelope: Envelope,
    workspace_id: str,
    trigger_id: str,
    secret: str,
    grace_seconds: float,
) -> store.Record | None:
    """Retire the current secret after the grace period and add `secret`, sealed."""

    async def seal_as(secret_id: int) -> bytes:
        return await seal(envelope, workspace_id, trigger_id, secret_id, secret)

    return await store.rotate_secret(pool, workspace_id, trigger_id, seal_as, grace_seconds)


async def for_delivery(
    pool: store.Pool, envelope: Envelope, workspace_id: str, trigger_id: str
) -> tuple[Any, list[str]] | None:
    """An enabled HTTP trigger and its active secrets opened (newest first), or None.

    Raises CannotOpen when a secret does not open (a wrong key file, a tampered row)."""
    row = await store.for_delivery(pool, workspace_id, trigger_id)
    if row is None:
        return None
    opened = []
    for secret_id, sealed, plain in zip(
        row["secret_ids"], row["sealed_secrets"], row["plain_secrets"], strict=True
    ):
        if sealed is None:
            opened.append(plain)  # written before 0008, not backfilled yet
            continue
        value = await envelope.open(
            workspace_id, TRIGGER_SECRET, object_id(trigger_id, secret_id), sealed
        )
        opened.append(value.decode())
    return row, opened


async def backfill(pool: store.Pool, envelope: Envelope, batch: int = 100) -> int:
    """Seal every secret still stored in plain text and clear it; how many this call sealed.

    Workspace by workspace, so that each locking read names one workspace (on Citus: one
    shard). A round that seals nothing left the rest to the replicas holding it."""
    sealed = 0
    while True:
        workspaces = await store.plaintext_workspaces(pool, batch)
        this_round = 0
        for workspace_id in workspaces:
            this_round += await _backfill_workspace(pool, envelope, workspace_id, batch)
        sealed += this_round
        if len(workspaces) < batch or not this_round:
            break
    if sealed:
        log.info("sealed %d trigger signing secret(s) stored in plain text", sealed)
    return sealed


async def _backfill_workspace(
    pool: store.Pool, envelope: Envelope, workspace_id: str, batch: int
) -> int:
    sealed = 0
    while True:
        async with store.transaction(pool) as conn:
            rows = await store.plaintext_secrets(conn, workspace_id, batch)
            for r in rows:
                value = await seal(
                    envelope, r["workspace_id"], r["trigger_id"], r["secret_id"], r["secret"]
                )
                await store.replace_plaintext(
                    conn, r["workspace_id"], r["trigger_id"], r["secret_id"], value
                )
        sealed += len(rows)
        if len(rows) < batch:
            return sealed
