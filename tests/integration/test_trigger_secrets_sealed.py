"""Trigger signing secrets sealed at rest, against real control planes, Postgres and key files:
nothing readable in the table, legacy plain rows backfilled at startup, copied rows refused,
rotations (from the CLI, beside a running server) keep deliveries verifying, and no secret
or data key in the control plane's log."""

from __future__ import annotations

import asyncio
import base64
import sys

import httpx
import pytest

from agentrun.v1 import trigger_pb2
from control_plane.crypto.envelope import Envelope
from control_plane.crypto.kms import LocalKms, WrappedKey
from control_plane.ground.config import ServerConfig
from control_plane.server import start
from control_plane.triggers import sealed_secrets
from tests import factories
from tests.harness.auth import workspace_key
from tests.harness.triggers import TriggerApi, post, signed

WS = "ws"
LEGACY = "legacy-plaintext-secret-0123456789abcdef"


@pytest.fixture
def key_file(tmp_path):
    return LocalKms.create(tmp_path / "kms.json").path


class Replica:
    """An in-process control plane with its API and HTTP clients."""

    def __init__(self, db_url: str, key_file, workspace: str = WS) -> None:
        self.config = ServerConfig(
            database_url=db_url, listen="127.0.0.1:0", kms_key_file=str(key_file)
        )
        self.workspace = workspace
        self.db_url = db_url

    async def __aenter__(self) -> Replica:
        self.server = await start(self.config)
        key = await workspace_key(self.config.database_url, self.workspace)
        self.api = TriggerApi(f"127.0.0.1:{self.server.port}", self.workspace, key=key)
        self.http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.server.http_port}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()
        await self.api.close()
        await self.server.stop(grace=0)

    async def deliver(self, trigger_id: str, secret: str, n: int, ws: str = WS) -> int:
        body, headers = signed("hmac_sha256", secret, {"n": n}, f"delivery-{n}")
        return (await post(self.http, ws, trigger_id, body, headers)).status_code


async def secret_rows(db, ws: str = WS):
    return await db.fetch(
        "SELECT trigger_id, secret_id, secret, sealed FROM trigger_secrets "
        "WHERE workspace_id = $1 ORDER BY trigger_id, secret_id",
        ws,
    )


async def test_secrets_are_stored_sealed_and_shown_only_to_their_creator(db_url, db, key_file):
    async with Replica(db_url, key_file) as cp:
        await cp.api.publish("triage")
        first = await cp.api.webhook("hook", "triage", "hmac_sha256")
        second = await cp.api.rotate("hook", grace=3600)
        rows = await secret_rows(db)
        assert [(r["secret_id"], r["secret"]) for r in rows] == [(1, None), (2, None)]
        for row, secret in zip(rows, (first, second), strict=True):
            assert secret.encode() not in row["sealed"] and len(row["sealed"]) > len(secret)
        shown = await cp.api.triggers.GetTrigger(
            trigger_pb2.GetTriggerRequest(workspace_id=WS, trigger_id="hook")
        )
        wire = shown.SerializeToString()
        assert first.encode() not in wire and second.encode() not in wire
        assert [await cp.deliver("hook", s, n) for n, s in enumerate((first, second))] == [202] * 2


async def test_plain_rows_from_before_sealing_are_sealed_at_startup(db_url, db, key_file):
    async with Replica(db_url, key_file) as cp:
        await cp.api.publish("triage")
        await cp.api.webhook("hook", "triage", "hmac_sha256")
        # What migration 0008 leaves of a secret written before it: the plain value only.
        await db.execute(
            "UPDATE trigger_secrets SET secret = $1, sealed = NULL "
            "WHERE workspace_id = $2 AND trigger_id = 'hook'",
            LEGACY,
            WS,
        )
        assert await cp.deliver("hook", LEGACY, 1) == 202  # still verifies until backfilled

    async with Replica(db_url, key_file) as restarted:
        rows = await secret_rows(db)
        assert [(r["secret"], r["sealed"] is not None) for r in rows] == [(None, True)]
        assert LEGACY.encode() not in rows[0]["sealed"]
        assert (
            await db.fetchval("SELECT count(*) FROM trigger_secrets WHERE secret IS NOT NULL") == 0
        )
        assert await restarted.deliver("hook", LEGACY, 2) == 202


async def test_a_sealed_secret_copied_to_another_workspace_does_not_verify(
    db_url, db, key_file, caplog
):
    async with Replica(db_url, key_file) as a, Replica(db_url, key_file, "other") as b:
        for cp in (a, b):
            await cp.api.publish("triage")
        secret_a = await a.api.webhook("hook", "triage", "hmac_sha256")
        secret_b = await b.api.webhook("hook", "triage", "hmac_sha256")
        await db.execute(
            "UPDATE trigger_secrets SET sealed = (SELECT sealed FROM trigger_secrets "
            "WHERE workspace_id = 'ws' AND trigger_id = 'hook') "
            "WHERE workspace_id = 'other' AND trigger_id = 'hook'"
        )
        copied = await b.deliver("hook", secret_a, 1, ws="other")
        own = await b.deliver("hook", secret_b, 2, ws="other")
        assert (copied, own) == (503, 503)  # refused, and the sender retries after a fix
        assert await a.deliver("hook", secret_a, 3) == 202  # the original row still opens
        assert await db.fetchval("SELECT count(*) FROM runs WHERE workspace_id = 'other'") == 0
    assert "cannot open trigger_secret 'hook/1' of workspace 'other'" in caplog.text
    assert secret_a not in caplog.text and secret_b not in caplog.text


async def run_cli(db_url: str, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentrun_cli",
        "kms",
        *args,
        env={"DATABASE_URL": db_url, "PATH": "/usr/bin:/bin"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, out.decode()
    return out.decode()


async def test_cli_rotations_keep_every_secret_verifying(db_url, db, key_file):
    async with Replica(db_url, key_file) as cp:
        await cp.api.publish("triage")
        old = await cp.api.webhook("hook", "triage", "hmac_sha256")
        kek = await run_cli(db_url, "rotate-kek", "--key-file", str(key_file))
        assert "local:2" in kek and "re-wrapped 1 data key" in kek
        dek = await run_cli(
            db_url, "rotate-data-key", "--workspace", WS, "--key-file", str(key_file)
        )
        assert "data key v2" in dek
        assert await cp.deliver("hook", old, 1) == 202

    async with Replica(db_url, key_file) as fresh:  # nothing cached: opens through the new KEK
        assert await fresh.deliver("hook", old, 2) == 202
        new = await fresh.api.rotate("hook", grace=3600)
        sealed = await db.fetch(
            "SELECT secret_id, sealed FROM trigger_secrets WHERE workspace_id = $1 ORDER BY 1", WS
        )
        versions = [int.from_bytes(r["sealed"][1:5], "big") for r in sealed]
        assert versions == [1, 2]  # the old secret keeps its data key; the new one uses v2
        assert [await fresh.deliver("hook", s, n) for n, s in ((3, old), (4, new))] == [202, 202]
    status = await run_cli(db_url, "status", "--key-file", str(key_file))
    assert "local:2: 2 data key(s), 1 workspace(s)" in status


async def test_the_control_plane_log_holds_no_secret_or_data_key(
    db_url, db, key_file, control_plane
):
    cp = control_plane(db_url, AGENTRUN_KMS_KEY_FILE=key_file, AGENTRUN_LOG_LEVEL="DEBUG")
    api = TriggerApi(cp.address, WS, key=await workspace_key(db_url, WS))
    try:
        await api.publish("triage")
        secrets = [await api.webhook("hook", "triage", "hmac_sha256", secret=LEGACY)]
        async with httpx.AsyncClient(base_url=cp.http_url) as http:
            for n, secret in enumerate((LEGACY, "forged-" + LEGACY)):
                body, headers = signed("hmac_sha256", secret, {"n": n}, f"d-{n}")
                assert (await post(http, WS, "hook", body, headers)).status_code == (202, 401)[n]
            secrets.append(await api.rotate("hook", grace=0))
            body, headers = signed("hmac_sha256", secrets[-1], {"n": 9}, "d-9")
            assert (await post(http, WS, "hook", body, headers)).status_code == 202
    finally:
        await api.close()
    row = await db.fetchrow("SELECT * FROM workspace_data_keys WHERE workspace_id = $1", WS)
    data_key = await LocalKms(key_file).unwrap(
        WrappedKey(row["kms_key_version"], row["wrapped"]),
        context={"workspace_id": WS, "data_key_version": "1"},
    )
    log = cp.process.log_path.read_bytes()
    assert b"refused a delivery to ws/hook" in log  # the replica that verified, at DEBUG
    for secret in secrets:
        assert secret.encode() not in log
    for form in (data_key, data_key.hex().encode(), base64.b64encode(data_key)):
        assert form not in log


async def test_the_backfill_goes_workspace_by_workspace_in_batches(pool, db, key_file):
    # Seven workspaces with three plain secrets each, sealed in batches of two: the
    # backfill lists workspaces a batch at a time and seals each one's rows in batches.
    for n in range(7):
        ws = f"legacy-{n}"
        await factories.agent_version(pool, ws)
        await db.execute(
            "INSERT INTO triggers (workspace_id, trigger_id, agent_id, kind, scheme)"
            " VALUES ($1, 'hook', 'agent', 'webhook', 'hmac_sha256')",
            ws,
        )
        await db.executemany(
            "INSERT INTO trigger_secrets (workspace_id, trigger_id, secret_id, secret)"
            " VALUES ($1, 'hook', $2, $3)",
            [(ws, i, f"{LEGACY}-{i}") for i in (1, 2, 3)],
        )
    envelope = Envelope(pool, LocalKms(key_file))
    assert await sealed_secrets.backfill(pool, envelope, batch=2) == 21
    assert await db.fetchval("SELECT count(*) FROM trigger_secrets WHERE secret IS NULL") == 21
    assert await sealed_secrets.backfill(pool, envelope, batch=2) == 0
