"""Console sessions: sign a principal in, find the principal of a request, sign out.

A session acts as the principal that signed in, re-checked on every request: a
key's session ends with its key (revoked or expired, within the resolver's
cache TTL), a person's takes their current role and ends when they are no
longer a member of the workspace.
"""

from __future__ import annotations

from starlette.requests import Request

from control_plane.auth.principal import Kind, Principal
from control_plane.auth.resolver import Resolver
from control_plane.http.console import security
from control_plane.store import console as store
from control_plane.store import identity
from control_plane.store.db import Pool

SESSION_SECONDS = 8 * 3600
KINDS = {Kind.KEY: "key", Kind.PERSON: "person"}


class Sessions:
    def __init__(self, pool: Pool, resolver: Resolver) -> None:
        self.pool = pool
        self.resolver = resolver

    async def start(self, who: Principal) -> str:
        """A new session for `who` (a key or a person of a workspace): its cookie token."""
        assert who.workspace_id is not None and who.role is not None and who.kind in KINDS
        token = security.new_token()
        await store.insert_session(
            self.pool,
            store.NewSession(
                security.digest(token),
                who.workspace_id,
                KINDS[who.kind],
                who.name,
                who.role,
                who.credential_id,
                SESSION_SECONDS,
            ),
        )
        return token

    async def principal(self, request: Request) -> Principal | None:
        """The signed-in principal of the request's session cookie, or None."""
        token = request.cookies.get(security.SESSION_COOKIE)
        if not token or len(token) > 200:
            return None
        row = await store.get_session(self.pool, security.digest(token))
        if row is None:
            return None
        if row.kind == "person":
            role = await identity.member_role(self.pool, row.workspace_id, row.principal)
            if role is None:
                return None
            return Principal(
                Kind.PERSON, row.principal, row.workspace_id, role, None, row.credential_id
            )
        who = Principal(
            Kind.KEY, row.principal, row.workspace_id, row.role, None, row.credential_id
        )
        return who if await self.resolver.still_valid(who) else None

    async def end(self, request: Request) -> None:
        token = request.cookies.get(security.SESSION_COOKIE)
        if token:
            await store.delete_session(self.pool, security.digest(token))
