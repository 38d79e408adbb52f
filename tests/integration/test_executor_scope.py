"""Executor credentials and their scope: a pool never leases another tenant's run.

1,000 runs over 10 workspaces, two pools scoped to disjoint halves claiming
side by side (fresh runs, then every lease lapsed and taken again): every
lease owner and every epoch is the right pool's. Then real executors with no
credential or a workspace key cannot open Connect at all.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import grpc

from control_plane.store import lease
from tests import factories
from tests.harness import auth
from tests.harness.connect_probe import connect_code

WORKSPACES = [f"ws-{i}" for i in range(10)]
POOLS = {"pool-a": WORKSPACES[:5], "pool-b": WORKSPACES[5:]}


async def claim_all(pool, now=None) -> dict[str, list]:
    """Both pools claim concurrently until neither gets anything more."""
    got: dict[str, list] = {name: [] for name in POOLS}

    async def drain(name: str) -> None:
        while rows := await lease.claim_due(pool, [name] * 32, 30, now=now, scope=POOLS[name]):
            got[name] += rows

    await asyncio.gather(*(drain(name) for name in POOLS))
    return got


async def test_two_scoped_pools_never_lease_outside_their_scope(pool):
    for ws in WORKSPACES:
        await factories.queued_runs(pool, 100, workspace_id=ws)
        await pool.execute(
            "UPDATE workspaces SET max_concurrency = 1000 WHERE workspace_id = $1", ws
        )
    first = await claim_all(pool)
    assert sum(len(rows) for rows in first.values()) == 1000
    for name, rows in first.items():
        assert {r.workspace_id for r in rows} == set(POOLS[name])
    # Every lease lapses: the lapsed-lease path must respect the scope too.
    later = max(r.wake_at for rows in first.values() for r in rows) + timedelta(seconds=1)
    again = await claim_all(pool, now=later)
    assert sum(len(rows) for rows in again.values()) == 1000
    for name, rows in again.items():
        assert {r.workspace_id for r in rows} <= set(POOLS[name])
    owners = await pool.fetch("SELECT workspace_id, lease_owner, lease_epoch FROM runs")
    for row in owners:
        assert row["workspace_id"] in POOLS[row["lease_owner"]], dict(row)
        assert row["lease_epoch"] == 2  # leased twice, both times by its own pool


async def open_connect(address: str, key: str | None) -> grpc.StatusCode:
    async with grpc.aio.insecure_channel(address) as channel:
        return await connect_code(channel, key)


async def test_connect_is_only_for_executor_credentials(server, db_url):
    address = f"127.0.0.1:{server.port}"
    admin = await auth.workspace_key(db_url, "ws-0")
    assert await open_connect(address, None) == grpc.StatusCode.UNAUTHENTICATED
    assert await open_connect(address, admin) == grpc.StatusCode.PERMISSION_DENIED
    assert await open_connect(address, await auth.executor_key(db_url)) == grpc.StatusCode.OK
