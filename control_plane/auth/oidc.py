"""OpenID Connect sign-in: ID tokens verified against the configured issuer's JWKS.

Interface (the identity interceptor and the HTTP guard call it):

    verifier = OidcVerifier(issuer, audience)
    person = await verifier.verify(id_token)   # VerifiedPerson, or raises Unauthenticated
"""

from __future__ import annotations

from dataclasses import dataclass

from control_plane.errors import Unauthenticated


@dataclass(frozen=True)
class VerifiedPerson:
    """A person whose ID token verified: `name` (the verified email) is the principal name."""

    issuer: str
    subject: str
    name: str


def looks_like_jwt(token: str) -> bool:
    """Three base64url parts: an ID token rather than one of our API keys."""
    return token.count(".") == 2 and not token.startswith("agr_")


class OidcVerifier:
    """Verifies ID tokens (RS256/ES256) of one issuer for one audience."""

    def __init__(self, issuer: str, audience: str) -> None:
        self.issuer = issuer
        self.audience = audience

    async def verify(self, id_token: str) -> VerifiedPerson:
        raise Unauthenticated("sign-in is not implemented yet")

    async def close(self) -> None:
        return None
