"""The dev stack's zero-config credentials: created once, 0600, reused while the database knows them."""

from __future__ import annotations

import stat

from agentrun.v1 import agent_pb2, agent_pb2_grpc
from control_plane.auth.bootstrap import ensure_dev_credentials
from tests.harness import auth


async def test_dev_credentials_are_created_once_and_work(db_url, db, server, tmp_path):
    path = tmp_path / "credentials.json"
    first = await ensure_dev_credentials(db_url, path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert await db.fetchval("SELECT count(*) FROM workspaces WHERE workspace_id = 'default'") == 1
    again = await ensure_dev_credentials(db_url, path)
    assert again == first and await db.fetchval("SELECT count(*) FROM api_keys") == 5
    roles = await db.fetch("SELECT kind, role, principal, scope FROM api_keys ORDER BY kind, role")
    assert {(r["kind"], r["role"]) for r in roles} == {
        ("executor", None),
        ("platform", None),
        ("workspace", "admin"),
        ("workspace", "approver"),
        ("workspace", "operator"),
    }
    assert "manager@example.com" in {r["principal"] for r in roles}
    async with auth.channel(f"127.0.0.1:{server.port}", first.admin_key) as channel:
        agents = agent_pb2_grpc.AgentServiceStub(channel)
        created = await agents.CreateAgent(agent_pb2.CreateAgentRequest(agent_id="triage"))
        assert created.agent.workspace_id == "default"
    # A database that forgot the keys (a fresh .data) gets new ones.
    await db.execute("DELETE FROM api_keys")
    renewed = await ensure_dev_credentials(db_url, path)
    assert renewed.admin_key != first.admin_key
