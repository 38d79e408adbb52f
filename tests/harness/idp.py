"""Talking to the sandbox identity provider (`python -m sandbox idp`) from tests."""

from __future__ import annotations

from typing import Any

import asyncpg
import httpx

from tests.harness.secrets_seen import remember


async def id_token(idp_url: str, email: str, **claims: Any) -> str:
    """An ID token for `email` from the sandbox IdP's token endpoint (see sandbox/idp.py)."""
    async with httpx.AsyncClient(base_url=idp_url, timeout=10.0) as client:
        resp = await client.post("/token", json={"email": email, **claims})
        resp.raise_for_status()
        return remember(str(resp.json()["id_token"]))


async def rotate(idp_url: str, alg: str = "RS256", grace_seconds: float = 60.0) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=idp_url, timeout=10.0) as client:
        resp = await client.post(
            "/_sandbox/rotate", json={"alg": alg, "grace_seconds": grace_seconds}
        )
        resp.raise_for_status()
        return dict(resp.json())


async def stats(idp_url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=idp_url, timeout=10.0) as client:
        resp = await client.get("/_sandbox/stats")
        resp.raise_for_status()
        return dict(resp.json())


async def signed_in(idp_url: str, email: str) -> list[tuple[str, str]]:
    """gRPC metadata of a person signed in at the sandbox IdP."""
    return [("authorization", f"Bearer {await id_token(idp_url, email)}")]


async def add_member(db: Any, workspace_id: str, person: str, role: str) -> None:
    """Make `person` (a verified email, stored lower-cased as sign-in compares it) a member
    of the workspace with `role`."""
    await db.execute(
        "INSERT INTO workspace_members (workspace_id, person, role, added_by)"
        " VALUES ($1, $2, $3, 'test-harness')",
        workspace_id,
        person.strip().lower(),
        role,
    )


async def member_signed_in(
    db_url: str,
    idp_url: str,
    workspace_id: str = "ws",
    email: str = "approver@example.com",
    role: str = "admin",
) -> list[tuple[str, str]]:
    """gRPC metadata of `email` signed in at the sandbox IdP, made a `role` member of the
    (existing) workspace first. An admin member matches a policy that names nobody."""
    conn = await asyncpg.connect(db_url)
    try:
        await add_member(conn, workspace_id, email, role)
    finally:
        await conn.close()
    return await signed_in(idp_url, email)
