"""Approvals against real Postgres: the one-transaction hold, CAS races, links, Slack, expiry.

Who may decide (signed-in people, keys, money-moving tools, four eyes) is in
test_approvals_identity.py.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from datetime import timedelta

import grpc
import httpx
import pytest

from agentrun.v1 import approval_pb2, approval_pb2_grpc, executor_pb2
from control_plane.approvals import decisions, expiry, relay
from control_plane.approvals.hashing import arguments_sha256, canonical_json
from control_plane.ground.errors import Aborted
from control_plane.server import start
from control_plane.store import lease, runs, steps
from control_plane.store.errors import Fenced
from control_plane.triggers import signatures
from tests import factories
from tests.harness import auth
from tests.harness.agentrun_api import sandbox_requests
from tests.harness.approval_routes import (  # noqa: F401 (fixtures)
    SLACK_SECRET,
    config_fixture,
    http_fixture,
    pool_fixture,
)
from tests.harness.commits import approval_commit
from tests.harness.idp import add_member, id_token

POLICY = {
    "approvers": ["alice@example.com", "bob@example.com"],
    "slack_approvers": ["U_ALICE"],
    "on_expiry": "reject",
    "expiry_seconds": 3600,
}


async def hold(pool, policy=None, tool="send_email", arguments=None, agent="mailer", **flags):
    """A run parked on an approval exactly as an executor's commit leaves it."""
    arguments = arguments or {"to": "ada@example.com", "subject": "hi", "body": "hello"}
    spec = {**factories.DEFAULT_SPEC, "approval": policy or POLICY}
    await factories.agent_version(pool, "ws", agent, spec)
    adm = runs.Admission("ws", agent, 1, "go", None, 50, 100_000, 100, 3600)
    run = await runs.insert_run(pool, adm)
    held = [r for r in await lease.claim_due(pool, ["ex"], 30) if r.run_id == run.run_id]
    decision = {"content": None, "tool_calls": [{"id": "c1", "name": tool, "arguments": arguments}]}
    approval_id = uuid.uuid4()
    req = steps.CommitRequest(
        "ws",
        run.run_id,
        held[0].lease_epoch,
        [
            steps.NewStep(1, "model_decision", None, json.dumps(decision)),
            steps.NewStep(
                2, "approval_requested", 1, json.dumps({"approval_id": str(approval_id)})
            ),
        ],
        steps.Transition(status="waiting", wait_reason="approval"),
    )
    ask = executor_pb2.ApprovalRequest(
        approval_id=str(approval_id),
        decision_seq=1,
        call_id="c1",
        tool=tool,
        arguments_json=canonical_json(arguments),
        arguments_sha256=arguments_sha256(arguments),
        **flags,
    )
    await approval_commit(pool, req, ask, 30)
    return run.run_id, approval_id


async def test_the_hold_is_one_transaction_and_a_fenced_hold_writes_nothing(pool):
    run_id, approval_id = await hold(pool)
    run = await runs.get_run(pool, "ws", run_id)
    assert (run.status, run.wait_reason, run.lease_owner, run.wake_at) == (
        "waiting",
        "approval",
        None,
        None,
    )
    approval = await pool.fetchrow("SELECT * FROM approvals WHERE approval_id = $1", approval_id)
    assert approval["decision"] is None and approval["call_id"] == "c1"
    assert approval["arguments_sha256"] == arguments_sha256(json.loads(approval["arguments"]))
    outbox = await pool.fetch("SELECT channel, recipient FROM outbox")
    assert {tuple(r) for r in outbox} == {
        ("chat", "#approvals"),
        ("mail", "alice@example.com"),
        ("mail", "bob@example.com"),
    }
    # A stale epoch commits nothing: no step, no approval, no notification.
    ask = executor_pb2.ApprovalRequest(
        approval_id=str(uuid.uuid4()),
        decision_seq=1,
        call_id="c2",
        tool="send_email",
        arguments_json="{}",
        arguments_sha256=arguments_sha256({}),
    )
    stale = steps.CommitRequest(
        "ws",
        run_id,
        1,
        [steps.NewStep(3, "approval_requested", 1, "{}")],
        steps.Transition(status="waiting", wait_reason="approval"),
    )
    with pytest.raises(Fenced):
        await approval_commit(pool, stale, ask, 30)
    assert await pool.fetchval("SELECT count(*) FROM approvals") == 1
    assert await pool.fetchval("SELECT count(*) FROM outbox") == 3


async def test_500_concurrent_decision_races_resolve_exactly_once(pool):
    held = [await hold(pool, agent=f"a{i}") for i in range(500)]

    async def race(approval_id):
        alice = decisions.Decider("alice@example.com", decisions.SIGNED_IN)
        bob = decisions.Decider("bob@example.com", decisions.KEY)
        reqs = [
            decisions.Request("ws", approval_id, alice, "approve"),
            decisions.Request("ws", approval_id, bob, "reject", reason="wrong price"),
        ]
        return await asyncio.gather(
            *(decisions.decide(pool, r) for r in reqs), return_exceptions=True
        )

    outcomes = await asyncio.gather(*(race(a) for _, a in held))
    for result in outcomes:
        won = [r for r in result if not isinstance(r, BaseException)]
        lost = [r for r in result if isinstance(r, BaseException)]
        assert len(won) == 1 and len(lost) == 1, result
        assert isinstance(lost[0], Aborted)
        assert f"by {won[0].decided_by}" in str(lost[0])
    counts = await pool.fetch(
        "SELECT run_id, count(*) FROM steps WHERE kind = 'approval_decided' GROUP BY run_id"
    )
    assert len(counts) == 500 and {c["count"] for c in counts} == {1}
    woken = await pool.fetchval("SELECT count(*) FROM runs WHERE wake_at IS NOT NULL")
    assert woken == 500


async def test_grpc_decision_race_tells_the_loser_who_won(pool, config, db_url):
    _, approval_id = await hold(pool)
    server = await start(config)

    async def as_approver(who: str) -> approval_pb2_grpc.ApprovalServiceStub:
        key = await auth.workspace_key(db_url, "ws", role="approver", principal=who)
        channel = auth.channel(f"127.0.0.1:{server.port}", key)
        channels.append(channel)
        return approval_pb2_grpc.ApprovalServiceStub(channel)

    channels: list[grpc.aio.Channel] = []
    try:
        stub = await as_approver("alice@example.com")
        first = await stub.DecideApproval(
            approval_pb2.DecideApprovalRequest(
                workspace_id="ws",
                approval_id=str(approval_id),
                approver="alice@example.com",
                approve=approval_pb2.Approve(),
            )
        )
        assert first.approval.state == approval_pb2.APPROVAL_STATE_APPROVED
        stub = await as_approver("bob@example.com")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.DecideApproval(
                approval_pb2.DecideApprovalRequest(
                    workspace_id="ws",
                    approval_id=str(approval_id),
                    approver="bob@example.com",
                    reject=approval_pb2.Reject(reason="no"),
                )
            )
        assert info.value.code() == grpc.StatusCode.ABORTED
        assert "approved by alice@example.com" in info.value.details()
        stub = await as_approver("mallory")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.DecideApproval(
                approval_pb2.DecideApprovalRequest(
                    workspace_id="ws",
                    approval_id=str(approval_id),
                    approver="mallory",
                    approve=approval_pb2.Approve(),
                )
            )
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        for channel in channels:
            await channel.close()
        await server.stop(grace=0)


async def delivered_link(pool, config, approver="alice@example.com") -> str:
    """Run the relay once and pull the approver's link out of the mail it sent."""
    async with httpx.AsyncClient() as client:
        await relay.relay_once(
            pool, client, relay.RelayConfig(config.notify_url, config.public_url)
        )
    mails = [
        r
        for r in sandbox_requests(config.notify_url)
        if r["path"] == "/mail/send" and r["body"]["to"] == approver
    ]
    link = re.search(r"http://approvals\.test(/approvals/\S+)", mails[-1]["body"]["body"])
    return link.group(1)


async def test_links_are_single_use_capabilities_and_get_never_decides(pool, config, http):
    _, approval_id = await hold(pool)
    path = await delivered_link(pool, config)
    shown = await http.get(path)
    assert shown.status_code == 200 and "ada@example.com" in shown.text
    assert shown.headers["referrer-policy"] == "no-referrer"
    assert "default-src 'none'" in shown.headers["content-security-policy"]
    again = await http.get(path)  # scanners may fetch it as often as they like
    assert again.status_code == 200
    assert await pool.fetchval("SELECT decision FROM approvals") is None
    stored = await pool.fetchval("SELECT token_sha256 FROM approval_tokens LIMIT 1")
    assert path.rsplit("/", 1)[1].encode() not in stored  # only the hash is kept

    decided = await http.post(path, data={"decision": "approve"})
    assert decided.status_code == 200
    assert await pool.fetchval("SELECT decided_by FROM approvals") == "alice@example.com"
    assert await audited(pool) == [("link:alice@example.com", "approved", "link")]
    reused = await http.post(path, data={"decision": "reject"})
    assert reused.status_code == 410
    assert (
        await http.post("/approvals/ws/not-a-token", data={"decision": "approve"})
    ).status_code == 404
    assert await pool.fetchval("SELECT decision FROM approvals") == "approved"


async def test_expired_link_and_high_risk_link_are_refused_and_change_nothing(pool, config, http):
    await hold(pool, agent="one")
    path = await delivered_link(pool, config)
    await pool.execute("UPDATE approval_tokens SET expires_at = now() - interval '1 s'")
    assert (await http.post(path, data={"decision": "approve"})).status_code == 410

    await pool.execute("DELETE FROM outbox")
    risky = {**POLICY, "high_risk_tools": ["send_email"]}
    _, risky_id = await hold(pool, policy=risky, agent="two")
    path = await delivered_link(pool, config, "bob@example.com")
    refused = await http.post(path, data={"decision": "approve"})
    assert refused.status_code == 403 and "high-risk" in refused.text
    assert await pool.fetchval("SELECT count(*) FROM approvals WHERE decision IS NOT NULL") == 0
    assert (
        await pool.fetchval("SELECT count(*) FROM approval_tokens WHERE used_at IS NOT NULL") == 0
    )

    await add_member(pool, "ws", "bob@example.com", "approver")
    bearer = await id_token(config.oidc_issuer, "bob@example.com")
    forged = await id_token(config.oidc_issuer, "bob@example.com", forge="wrong_key")
    url = f"/approvals/ws/id/{risky_id}/decision"
    bad = await http.post(
        url, json={"decision": "approve"}, headers={"authorization": f"Bearer {forged}"}
    )
    assert bad.status_code == 401
    ok = await http.post(
        url, json={"decision": "approve"}, headers={"authorization": f"Bearer {bearer}"}
    )
    assert ok.status_code == 200 and ok.json()["decided_by"] == "bob@example.com"
    step = await pool.fetchval("SELECT payload FROM steps WHERE kind = 'approval_decided'")
    assert json.loads(step)["via"] == "signed_in"
    assert await audited(pool) == [("person:bob@example.com", "approved", "signed_in")]


async def audited(pool) -> list[tuple[str, str, str]]:
    """The approval decisions in the audit log: (actor, decision, via)."""
    rows = await pool.fetch(
        "SELECT actor, detail FROM audit_log WHERE action = 'approval.decided' ORDER BY audit_id"
    )
    return [
        (r["actor"], json.loads(r["detail"])["decision"], json.loads(r["detail"])["via"])
        for r in rows
    ]


def slack_request(body: bytes, secret: bytes = SLACK_SECRET, age: float = 0) -> dict:
    """Headers as Slack signs a click (v0 over v0:timestamp:body), made `age` seconds ago."""
    signed = signatures.sign("slack", secret.decode(), body, timestamp=int(time.time() - age))
    return {**signed, "content-type": "application/x-www-form-urlencoded"}


def slack_body(user: str, approval_id, action="approve") -> bytes:
    payload = {
        "type": "block_actions",
        "user": {"id": user},
        "actions": [{"action_id": action, "value": f"ws:{approval_id}"}],
    }
    return httpx.QueryParams({"payload": json.dumps(payload)}).__str__().encode()


async def test_slack_buttons_check_the_signature_the_window_and_the_user(pool, http):
    _, approval_id = await hold(pool)
    body = slack_body("U_ALICE", approval_id)
    forged = await http.post(
        "/slack/interactions", content=body, headers=slack_request(body, secret=b"not the secret")
    )
    stale = await http.post(
        "/slack/interactions", content=body, headers=slack_request(body, age=600)
    )
    stranger_body = slack_body("U_MALLORY", approval_id)
    stranger = await http.post(
        "/slack/interactions", content=stranger_body, headers=slack_request(stranger_body)
    )
    assert (forged.status_code, stale.status_code, stranger.status_code) == (401, 401, 403)
    assert await pool.fetchval("SELECT decision FROM approvals") is None
    ok = await http.post("/slack/interactions", content=body, headers=slack_request(body))
    assert ok.status_code == 200 and ok.json()["decided_by"] == "U_ALICE"
    assert await audited(pool) == [("slack:U_ALICE", "approved", "slack")]


async def expire_at_expiry(pool, approval_id):
    row = await pool.fetchrow("SELECT expire_at FROM approvals WHERE approval_id = $1", approval_id)
    return await expiry.expire_once(pool, now=row["expire_at"] + timedelta(milliseconds=1))


async def test_expiry_reject_decides_at_the_expiry_time_with_no_executor(pool):
    run_id, approval_id = await hold(pool)
    assert await expiry.expire_once(pool) == []  # not yet
    assert await expire_at_expiry(pool, approval_id) == ["reject"]
    row = await pool.fetchrow("SELECT decision, decided_by FROM approvals")
    assert tuple(row) == ("expired", "system:expiry")
    run = await runs.get_run(pool, "ws", run_id)
    assert (run.status, run.lease_owner) == ("waiting", None) and run.wake_at is not None
    step = await pool.fetchrow("SELECT payload FROM steps WHERE kind = 'approval_decided'")
    payload = json.loads(step["payload"])
    assert (payload["reason"], payload["via"], payload["decided_by"]) == (
        "approval expired",
        "expiry",
        "system:expiry",
    )


async def test_expiry_escalates_once_then_rejects(pool):
    policy = {**POLICY, "on_expiry": "escalate", "escalate_to": ["carol@example.com"]}
    _, approval_id = await hold(pool, policy=policy)
    await pool.execute("DELETE FROM outbox")
    assert await expire_at_expiry(pool, approval_id) == ["escalate"]
    row = await pool.fetchrow("SELECT approvers, escalation_level, decision FROM approvals")
    assert tuple(row) == (["carol@example.com"], 1, None)
    assert await pool.fetchval("SELECT recipient FROM outbox") == "carol@example.com"
    assert await expire_at_expiry(pool, approval_id) == ["reject"]


async def test_expiry_reminds_up_to_the_limit_and_never_approves_money(pool):
    policy = {**POLICY, "on_expiry": "remind", "max_reminders": 2}
    _, approval_id = await hold(pool, policy=policy, moves_money=True)
    assert await expire_at_expiry(pool, approval_id) == ["remind"]
    assert await expire_at_expiry(pool, approval_id) == ["remind"]
    assert await expire_at_expiry(pool, approval_id) == ["reject"]
    row = await pool.fetchrow("SELECT reminders_sent, decision FROM approvals")
    assert tuple(row) == (2, "expired")
    kinds = await pool.fetch("SELECT kind FROM outbox WHERE kind = 'approval_reminder'")
    assert len(kinds) == 4  # two approvers, two reminders
