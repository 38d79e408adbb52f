"""A key revoked on one replica is refused on every other within 5 s; no secret is ever logged."""

from __future__ import annotations

import time

import grpc

from agentrun.v1 import admin_pb2, admin_pb2_grpc, agent_pb2, agent_pb2_grpc
from control_plane.auth import keys
from tests.harness import auth
from tests.harness.waiting import eventually


async def test_a_revoked_key_is_refused_by_the_other_replica_within_five_seconds(
    db_url, control_plane
):
    one, two = control_plane(db_url), control_plane(db_url)
    admin = await auth.workspace_key(db_url, "acme")
    victim = await auth.workspace_key(db_url, "acme", role="reader", principal="leaver")
    victim_id = keys.parse(victim).key_id
    get = agent_pb2.GetAgentRequest(agent_id="nobody")
    async with auth.channel(two.address, victim) as on_two, auth.channel(one.address, admin) as a:
        agents_two = agent_pb2_grpc.AgentServiceStub(on_two)
        for _ in range(3):  # warm replica two's cache: the key is known and trusted there
            try:
                await agents_two.GetAgent(get)
            except grpc.aio.AioRpcError as err:
                assert err.code() == grpc.StatusCode.NOT_FOUND, err.details()
        admin_one = admin_pb2_grpc.WorkspaceAdminServiceStub(a)
        await admin_one.RevokeApiKey(admin_pb2.RevokeApiKeyRequest(key_id=victim_id))
        revoked_at = time.monotonic()

        async def refused() -> bool:
            try:
                await agents_two.GetAgent(get)
            except grpc.aio.AioRpcError as err:
                return err.code() == grpc.StatusCode.UNAUTHENTICATED
            return False

        await eventually(refused, timeout=10, interval=0.1, message="replica two kept the key")
        assert time.monotonic() - revoked_at < 5.0
        audit = await admin_one.ListAuditLog(admin_pb2.ListAuditLogRequest())
        assert [(e.action, e.object_id) for e in audit.entries][:1] == [("key.revoked", victim_id)]
    for replica in (one, two):  # no key text or secret ever reached a log line
        log = replica.process.log_path.read_text()
        for key in (admin, victim):
            assert keys.parse(key).secret not in log
