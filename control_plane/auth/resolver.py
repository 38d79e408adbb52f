"""Turns a bearer token into a Principal: the one resolver the gRPC interceptor and HTTP guard share.

API keys are looked up by their public id and compared in constant time with
the stored SHA-256. Verified keys are cached for `ttl` seconds (2 s by
default, bounded in size), so a warm replica answers without a database round
trip and a revocation on any replica takes effect on every other one within
`ttl` plus one lookup. ID tokens (three base64url parts) go to the OIDC
verifier; the person acts in the request's workspace with the role their
membership gives them.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime

from control_plane.auth import keys
from control_plane.auth.oidc import OidcVerifier, looks_like_jwt
from control_plane.auth.principal import Kind, Principal
from control_plane.ground.errors import InvalidArgument, PermissionDenied, Unauthenticated
from control_plane.store import identity as store

_KINDS = {"workspace": Kind.KEY, "executor": Kind.EXECUTOR, "platform": Kind.PLATFORM}
REFUSED = "the credential is unknown, revoked or expired"


def bearer(value: str | None) -> str | None:
    """The token of an `authorization: Bearer <token>` value (None when absent or not Bearer)."""
    if not value:
        return None
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def principal_of(row: store.StoredKey) -> Principal:
    kind = _KINDS[row.kind]
    return Principal(
        kind=kind,
        name=row.principal,
        workspace_id=row.workspace_id,
        role=row.role,
        scope=frozenset(row.scope) if row.scope is not None else None,
        credential_id=row.key_id,
    )


@dataclass
class _Cached:
    row: store.StoredKey
    until: float  # time.monotonic()


class Resolver:
    """Resolves credentials against one database, with a short TTL cache of verified keys."""

    def __init__(
        self,
        pool: store.Conn,
        verifier: OidcVerifier | None = None,
        *,
        ttl: float = 2.0,
        max_entries: int = 10_000,
    ) -> None:
        self._pool = pool
        self._verifier = verifier
        self._ttl = ttl
        self._max = max_entries
        self._keys: OrderedDict[str, _Cached] = OrderedDict()
        self._roles: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()

    @property
    def verifier(self) -> OidcVerifier | None:
        """The OIDC verifier people's ID tokens go to (None: sign-in is off)."""
        return self._verifier

    async def resolve(self, authorization: str | None, workspace_id: str = "") -> Principal:
        """The principal of an `authorization` header value; UNAUTHENTICATED when there is none."""
        token = bearer(authorization)
        if token is None:
            raise Unauthenticated("a credential is required: authorization: Bearer <key>")
        if looks_like_jwt(token):
            return await self._person(token, workspace_id)
        parsed = keys.parse(token)
        if parsed is None:
            raise Unauthenticated("the credential is not an agentrun key or ID token")
        row = await self._key(parsed.key_id)
        if row is None or row.kind != parsed.kind or not keys.matches(parsed, row.secret_sha256):
            raise Unauthenticated(REFUSED)
        return principal_of(row)

    async def still_valid(self, principal: Principal) -> bool:
        """Whether the key behind `principal` is still live (cached for at most `ttl`)."""
        if principal.kind is Kind.PERSON or not principal.credential_id:
            return True
        if principal.credential_id.startswith("cert:"):
            return True  # the TLS handshake verified it; certificates expire on their own
        return await self._key(principal.credential_id) is not None

    async def _key(self, key_id: str) -> store.StoredKey | None:
        now = time.monotonic()
        hit = self._keys.get(key_id)
        if hit is not None and hit.until > now and not _expired(hit.row):
            return hit.row
        row = await store.lookup_key(self._pool, key_id)
        if row is None:
            self._keys.pop(key_id, None)  # unknown keys are not cached: no one can fill it
            return None
        self._keys[key_id] = _Cached(row, now + self._ttl)
        self._keys.move_to_end(key_id)
        while len(self._keys) > self._max:
            self._keys.popitem(last=False)
        return row

    async def _person(self, token: str, workspace_id: str) -> Principal:
        if self._verifier is None:
            raise Unauthenticated("sign-in is not configured on this server")
        person = await self._verifier.verify(token)
        if not workspace_id:
            raise InvalidArgument("workspace_id", "is required when signed in as a person")
        role = await self._role(workspace_id, person.name)
        if role is None:
            raise PermissionDenied(f"{person.name} is not a member of this workspace")
        return Principal(Kind.PERSON, person.name, workspace_id, role, None, person.subject)

    async def _role(self, workspace_id: str, person: str) -> str | None:
        now = time.monotonic()
        hit = self._roles.get((workspace_id, person))
        if hit is not None and hit[1] > now:
            return hit[0]
        role = await store.member_role(self._pool, workspace_id, person)
        if role is None:  # not cached, as unknown keys are not: a new member signs in at once
            self._roles.pop((workspace_id, person), None)
            return None
        self._roles[(workspace_id, person)] = (role, now + self._ttl)
        while len(self._roles) > self._max:
            self._roles.popitem(last=False)
        return role


def _expired(row: store.StoredKey) -> bool:
    return row.expires_at is not None and row.expires_at <= datetime.now(UTC)
