"""Zero-config credentials for the dev stack, and the first platform key of a new deployment.

`ensure_dev_credentials` makes `agentrun dev` / `make run` work with auth on:
it creates the workspace, a platform key, admin/operator/approver keys of
the workspace and an all-workspaces executor credential, and writes them
(mode 0600) to a JSON file the CLI and the stack read. Run again, it reuses
the file while the database still knows every key in it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from control_plane.auth import keys
from control_plane.auth.credentials import KeyRequest, issue
from control_plane.store import db
from control_plane.store import identity as store
from control_plane.store.db import Connection, transaction

BOOTSTRAP = "bootstrap"


@dataclass(frozen=True)
class DevCredentials:
    workspace_id: str
    platform_key: str
    admin_key: str
    operator_key: str
    approver_key: str
    approver: str  # the approver key's principal: the approver's email
    executor_key: str

    def __repr__(self) -> str:  # never print the keys by accident
        return f"DevCredentials(workspace_id={self.workspace_id!r})"

    @property
    def all_keys(self) -> list[str]:
        return [
            self.platform_key,
            self.admin_key,
            self.operator_key,
            self.approver_key,
            self.executor_key,
        ]


async def _still_valid(conn: Connection, creds: DevCredentials) -> bool:
    for text in creds.all_keys:
        parsed = keys.parse(text)
        row = await store.lookup_key(conn, parsed.key_id) if parsed else None
        if row is None or parsed is None or not keys.matches(parsed, row.secret_sha256):
            return False
    return True


def _read(path: Path) -> DevCredentials | None:
    try:
        return DevCredentials(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _write(path: Path, creds: DevCredentials) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(creds), f, indent=2)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


async def _mint(conn: Connection, workspace_id: str, approver: str) -> DevCredentials:
    async def key(kind: str, principal: str, role: str | None = None) -> str:
        ws = workspace_id if kind == "workspace" else None
        return (await issue(conn, KeyRequest(kind, principal, BOOTSTRAP, ws, role))).text

    async with transaction(conn):
        await store.create_workspace(conn, workspace_id, "team", None)
        # The approver may also sign in (the dev stack's sandbox identity provider).
        await store.add_member(conn, workspace_id, approver, "approver", BOOTSTRAP)
        return DevCredentials(
            workspace_id=workspace_id,
            platform_key=await key("platform", "dev-platform-admin"),
            admin_key=await key("workspace", "dev-admin", "admin"),
            operator_key=await key("workspace", "dev-operator", "operator"),
            approver_key=await key("workspace", approver, "approver"),
            approver=approver,
            executor_key=await key("executor", "dev-executors"),
        )


async def ensure_dev_credentials(
    database_url: str,
    path: Path,
    workspace_id: str = "default",
    approver: str = "manager@example.com",
) -> DevCredentials:
    """The dev stack's credentials: those in `path` if the database still knows them, else new."""
    conn = await db.connect(database_url)
    try:
        known = _read(path)
        if (
            known is not None
            and known.workspace_id == workspace_id
            and known.approver == approver
            and await _still_valid(conn, known)
        ):
            return known
        creds = await _mint(conn, workspace_id, approver)
    finally:
        await conn.close()
    _write(path, creds)
    return creds


async def first_platform_key(database_url: str, principal: str = "platform-admin") -> str:
    """Mint a platform admin key straight into the database (`agentrun admin bootstrap`)."""
    conn = await db.connect(database_url)
    try:
        return (await issue(conn, KeyRequest("platform", principal, BOOTSTRAP))).text
    finally:
        await conn.close()
