"""What HTTP route modules are given: the pool, the settings, the envelope, the wake-up hooks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from control_plane.auth.oidc import OidcVerifier
from control_plane.auth.resolver import Resolver
from control_plane.connections.flows import ConnectionFlows
from control_plane.crypto.envelope import Envelope
from control_plane.ground.config import ServerConfig
from control_plane.ops.readiness import Readiness
from control_plane.store.db import Pool

if TYPE_CHECKING:
    from control_plane.dispatch.fast_path import FastPath
    from control_plane.http.api import Services


def _nothing() -> None:
    pass


@dataclass(frozen=True)
class HttpContext:
    pool: Pool
    config: ServerConfig
    # Opens the triggers' sealed signing secrets.
    envelope: Envelope
    # A run became runnable: claim soon (the dispatcher's poke).
    on_runnable: Callable[[], None] = _nothing
    # A push source has a fetch queued: fetch soon.
    on_fetch_queued: Callable[[], None] = _nothing
    # Bearer credentials of guarded routes (control_plane/http/auth.py); None: one of
    # this pool's own, without sign-in.
    resolver: Resolver | None = None
    # The replica's OIDC verifier (the one inside `resolver`); None: nobody signs in.
    verifier: OidcVerifier | None = None
    # Connecting accounts (control_plane/http/connections.py); None: no connection routes.
    connections: ConnectionFlows | None = None
    # Whether the database answers (/readyz); None: the routes make their own.
    readiness: Readiness | None = None
    # Fast-path session turns go straight to an executor (control_plane/dispatch/fast_path.py).
    fast_path: FastPath | None = None
    # The gRPC server's servicers, which the HTTP/JSON API calls (control_plane/http/api.py);
    # None: no API routes.
    services: Services | None = None

    def credentials(self) -> Resolver:
        if self.resolver is not None:
            return self.resolver
        return Resolver(self.pool, self.verifier)
