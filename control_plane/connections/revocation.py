"""Revoking a connection: at its provider first (RFC 7009), then on our side, whatever the
provider answered.

The provider is asked first, with the refresh token (revoking it revokes the grant, §2.1)
or else the access token, so that a crash in between leaves nothing orphaned: our side still
holds the tokens and the revocation can be asked again (an unknown or already revoked token
is no error to the provider, §2.2). Then, in one transaction, the connection becomes revoked
(its sealed tokens dropped) and the audit log records what the provider said. A provider that
does not answer or refuses does not keep the connection usable: it is revoked here all the
same, and its status_reason and audit entry say that the grant may still be live at the
provider. Nothing recorded ever carries a token: only the outcome's kind or error code.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from control_plane.auth import audit
from control_plane.connections.client import GrantRefused, OAuthClient, ProviderUnreachable
from control_plane.connections.tokens import token_id
from control_plane.crypto.envelope import CONNECTION_TOKEN, Envelope
from control_plane.store import connections as store
from control_plane.store.connections import StoredConnection
from control_plane.store.db import Pool, transaction

log = logging.getLogger(__name__)

REASON = "revoked by workspace"


@dataclass(frozen=True)
class AtProvider:
    """What the provider's revocation endpoint came to."""

    revoked: bool
    detail: str  # "revoked", "no token held", or why not (never a token)


class Revocations:
    def __init__(self, pool: Pool, envelope: Envelope, client: OAuthClient) -> None:
        self.pool, self.envelope, self.client = pool, envelope, client

    async def revoke(self, row: StoredConnection) -> bool:
        """Revoke at the provider, then here; whether our side changed (False: it was
        revoked already, and the provider was not asked again)."""
        if row.status == "revoked":
            return False
        outcome = await self.at_provider(row)
        reason = REASON if outcome.revoked else f"{REASON}; at the provider: {outcome.detail}"
        async with transaction(self.pool) as conn:
            changed = await store.set_status(
                conn, row.workspace_id, row.connection_id, "revoked", reason
            )
            if changed is not None:
                detail = {"provider_revoked": outcome.revoked, "provider": outcome.detail}
                await audit.record(
                    conn, "connection.revoked", "connection", row.connection_id, detail
                )
        return changed is not None

    async def at_provider(self, row: StoredConnection) -> AtProvider:
        """Ask the provider to revoke the grant (RFC 7009); never raises."""
        which, sealed = (
            ("refresh", row.refresh_sealed) if row.refresh_sealed else ("access", row.access_sealed)
        )
        if sealed is None:
            return AtProvider(False, "no token held")
        try:
            token = await self.envelope.open(
                row.workspace_id, CONNECTION_TOKEN, token_id(row.connection_id, which), sealed
            )
            await self.client.revoke(row.provider, token.decode(), f"{which}_token")
        except ProviderUnreachable as exc:
            log.warning(
                "connection %s: revocation at the provider failed: %s", row.connection_id, exc
            )
            return AtProvider(False, f"revocation failed ({exc})")
        except GrantRefused as exc:
            log.warning(
                "connection %s: the provider refused the revocation: %s",
                row.connection_id,
                exc.error,
            )
            return AtProvider(False, f"revocation refused ({exc.error})")
        except Exception as exc:  # noqa: BLE001 - our side is revoked whatever went wrong
            log.error(
                "connection %s: revocation at the provider failed: %s",
                row.connection_id,
                type(exc).__name__,
            )
            return AtProvider(False, f"revocation failed ({type(exc).__name__})")
        return AtProvider(True, "revoked")
