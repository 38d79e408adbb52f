"""Who may decide an approval, against real Postgres, a real HTTP route and a real IdP.

The Must-show of issue 9: a money-moving approval cannot be decided by a link,
an operator key, a request naming an approver, or a signed-in person not on
the list; a signed-in person on the list can; `decided_by` is the
authenticated principal; four eyes refuses the run's own starter. The rules
are applied by `decisions.decide` for every door; the doors are exercised
through their real entry points (the HTTP route verifies its ID token itself;
the gRPC ones go through the identity interceptor, see the last tests).
"""

from __future__ import annotations

import json

import grpc
import pytest

from agentrun.v1 import approval_pb2, approval_pb2_grpc
from control_plane.api.approvals import decider_of
from control_plane.approvals import decisions
from control_plane.auth.principal import Kind, Principal
from control_plane.ground.errors import PermissionDenied
from control_plane.server import start
from tests.harness.approval_routes import config_fixture, http_fixture, pool_fixture  # noqa: F401
from tests.harness.idp import add_member, id_token
from tests.integration.test_approvals import (
    POLICY,
    delivered_link,
    hold,
    slack_body,
    slack_request,
)

ALICE, BOB = "alice@example.com", "bob@example.com"
CHARGE = {"customer": "cus_1", "amount_cents": 4200}


def person(name: str, role: str | None = None) -> Principal:
    return Principal(Kind.PERSON, name, workspace_id="ws", role=role)


def key(name: str, role: str) -> Principal:
    return Principal(Kind.KEY, name, workspace_id="ws", role=role, credential_id="k1")


async def decide_as(pool, approval_id, principal: Principal, action="approve", typed=""):
    """A decision exactly as DecideApproval makes it once the interceptor set `principal`."""
    decider = decider_of(principal, typed)
    return await decisions.decide(pool, decisions.Request("ws", approval_id, decider, action))


async def nothing_decided(pool) -> None:
    assert await pool.fetchval("SELECT count(*) FROM approvals WHERE decision IS NOT NULL") == 0
    assert await pool.fetchval("SELECT count(*) FROM steps WHERE kind = 'approval_decided'") == 0
    assert await pool.fetchval("SELECT count(*) FROM audit_log") == 0


async def hold_charge(pool, **kw):
    return await hold(pool, tool="charge_card", arguments=CHARGE, moves_money=True, **kw)


async def test_a_money_moving_call_refuses_links_keys_and_typed_names(pool, config, http):
    _, approval_id = await hold_charge(pool)
    # A link mailed to an approver on the list: refused, and the link is not used up.
    path = await delivered_link(pool, config, ALICE)
    assert "moves money" in (await http.get(path)).text
    refused = await http.post(path, data={"decision": "approve"})
    assert refused.status_code == 403 and "moves money" in refused.text
    assert (
        await pool.fetchval("SELECT count(*) FROM approval_tokens WHERE used_at IS NOT NULL") == 0
    )
    # An operator key, an admin key, an approver key named on the list: not people signed in.
    for who in (key(ALICE, "operator"), key(ALICE, "admin")):
        with pytest.raises(PermissionDenied, match="cannot decide approvals"):
            await decide_as(pool, approval_id, who)
    with pytest.raises(PermissionDenied, match="moves money.*not an API key"):
        await decide_as(pool, approval_id, key(ALICE, "approver"))
    # A request naming an approver: the caller is who decides, not the name it types.
    with pytest.raises(PermissionDenied, match="approver: a decision is recorded as"):
        await decide_as(pool, approval_id, person("mallory@example.com"), typed=ALICE)
    # A signed-in person who is not on the list.
    with pytest.raises(PermissionDenied, match="not an approver"):
        await decide_as(pool, approval_id, person("mallory@example.com", "approver"))
    # Executors and platform admins never decide.
    for cred in (Principal(Kind.EXECUTOR, "pool-a"), Principal(Kind.PLATFORM, "root")):
        with pytest.raises(PermissionDenied, match="never decides"):
            await decide_as(pool, approval_id, cred)
    await nothing_decided(pool)


async def test_a_signed_in_approver_on_the_list_decides_and_is_recorded(pool):
    run_id, approval_id = await hold_charge(pool)
    row = await decide_as(pool, approval_id, person(BOB), typed=BOB)  # repeating one's name is ok
    assert (row.decision, row.decided_by) == ("approved", BOB)
    step = json.loads(
        await pool.fetchval(
            "SELECT payload FROM steps WHERE run_id = $1 AND kind = 'approval_decided'", run_id
        )
    )
    assert (step["decided_by"], step["via"], step["decision"]) == (BOB, "signed_in", "approved")


async def test_an_approver_key_decides_an_ordinary_call_as_its_person(pool):
    _, approval_id = await hold(pool)
    row = await decide_as(pool, approval_id, key(ALICE, "approver"), action="reject")
    assert (row.decision, row.decided_by) == ("rejected", ALICE)
    step = json.loads(
        await pool.fetchval("SELECT payload FROM steps WHERE kind = 'approval_decided'")
    )
    assert step["via"] == "key"


async def test_the_signed_in_route_takes_the_person_from_the_id_token(pool, config, http):
    _, approval_id = await hold_charge(pool)
    url = f"/approvals/ws/id/{approval_id}/decision"
    iss = config.oidc_issuer

    async def post(token: str | None, body=None):
        headers = {"authorization": f"Bearer {token}"} if token else {}
        return await http.post(url, json=body or {"decision": "approve"}, headers=headers)

    await add_member(pool, "ws", "mallory@example.com", "approver")  # a member, not on the list
    refusals = {
        "no token": (await post(None)).status_code,
        "on the list, not a member": (await post(await id_token(iss, BOB))).status_code,
        "forged": (await post(await id_token(iss, BOB, forge="wrong_key"))).status_code,
        "alg none": (await post(await id_token(iss, BOB, forge="none"))).status_code,
        "expired": (await post(await id_token(iss, BOB, expires_in=-600))).status_code,
        "other audience": (await post(await id_token(iss, BOB, audience="x"))).status_code,
        "unverified email": (
            await post(await id_token(iss, BOB, email_verified=False))
        ).status_code,
        "not on the list": (await post(await id_token(iss, "mallory@example.com"))).status_code,
        "typed name ignored": (
            await post(
                await id_token(iss, "mallory@example.com"), {"decision": "approve", "approver": BOB}
            )
        ).status_code,
    }
    assert refusals == {
        "no token": 401,
        "on the list, not a member": 403,
        "forged": 401,
        "alg none": 401,
        "expired": 401,
        "other audience": 401,
        "unverified email": 401,
        "not on the list": 403,
        "typed name ignored": 403,
    }
    await nothing_decided(pool)
    await add_member(pool, "ws", "Bob@Example.com", "approver")  # stored as sign-in names him
    token = await id_token(iss, "Bob@Example.com", alg="ES256")
    ok = await post(token)
    assert ok.status_code == 200 and ok.json()["decided_by"] == BOB
    assert token not in ok.text
    assert await pool.fetchval("SELECT decided_by FROM approvals") == BOB
    audited = await pool.fetchrow("SELECT actor, action, object_id FROM audit_log")
    assert tuple(audited) == (f"person:{BOB}", "approval.decided", str(approval_id))


async def test_a_slack_click_cannot_decide_a_money_moving_call(pool, http):
    _, approval_id = await hold_charge(pool)
    body = slack_body("U_ALICE", approval_id)
    refused = await http.post("/slack/interactions", content=body, headers=slack_request(body))
    assert refused.status_code == 403 and "moves money" in refused.json()["error"]
    await nothing_decided(pool)


async def _four_eyes_run(pool, started_by: str):
    run_id, approval_id = await hold_charge(pool, policy={**POLICY, "four_eyes": True})
    await pool.execute("UPDATE runs SET started_by = $1 WHERE run_id = $2", started_by, run_id)
    return run_id, approval_id


async def test_four_eyes_refuses_the_runs_own_starter(pool):
    _, approval_id = await _four_eyes_run(pool, f"person:{ALICE}")
    with pytest.raises(PermissionDenied, match="four eyes"):
        await decide_as(pool, approval_id, person(ALICE))
    with pytest.raises(PermissionDenied, match="four eyes"):
        await decisions.decide(
            pool,
            decisions.Request(
                "ws",
                approval_id,
                decisions.Decider(ALICE, decisions.SIGNED_IN),
                "edit",
                edited_arguments_json=json.dumps(CHARGE),
            ),
        )
    await nothing_decided(pool)
    row = await decide_as(pool, approval_id, person(BOB))
    assert (row.decision, row.decided_by) == ("approved", BOB)


async def test_four_eyes_knows_the_starter_by_any_credential_and_lets_them_reject(pool):
    # Alice started the run with her approver key and now signs in: still the same person.
    _, approval_id = await _four_eyes_run(pool, f"key:{ALICE}")
    with pytest.raises(PermissionDenied, match="four eyes"):
        await decide_as(pool, approval_id, person(ALICE))
    row = await decide_as(pool, approval_id, person(ALICE), action="reject")
    assert (row.decision, row.decided_by) == ("rejected", ALICE)


async def test_without_four_eyes_the_starter_may_approve(pool):
    run_id, approval_id = await hold_charge(pool)
    await pool.execute(
        "UPDATE runs SET started_by = $1 WHERE run_id = $2", f"person:{ALICE}", run_id
    )
    assert (await decide_as(pool, approval_id, person(ALICE))).decided_by == ALICE


# --- over gRPC, through the identity interceptor ---------------------------------------------


async def test_grpc_decisions_are_the_signed_in_callers(pool, config):
    _, approval_id = await hold_charge(pool)
    for who in (ALICE, BOB, "mallory@example.com"):
        await add_member(pool, "ws", who, "approver")
    server = await start(config)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = approval_pb2_grpc.ApprovalServiceStub(ch)

            async def call(email: str | None, **fields):
                md = None
                if email is not None:
                    token = await id_token(config.oidc_issuer, email)
                    md = [("authorization", f"Bearer {token}")]
                req = approval_pb2.DecideApprovalRequest(
                    workspace_id="ws", approval_id=str(approval_id), **fields
                )
                return await stub.DecideApproval(req, metadata=md)

            codes = {}
            for label, email, fields in (
                ("no credential", None, {}),
                ("typed name", "mallory@example.com", {"approver": ALICE}),
                ("not on the list", "mallory@example.com", {}),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call(email, approve=approval_pb2.Approve(), **fields)
                codes[label] = info.value.code()
            assert codes == {
                "no credential": grpc.StatusCode.UNAUTHENTICATED,
                "typed name": grpc.StatusCode.PERMISSION_DENIED,
                "not on the list": grpc.StatusCode.PERMISSION_DENIED,
            }
            first = await call(ALICE, approve=approval_pb2.Approve())
            assert first.approval.decided_by == ALICE
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call(BOB, reject=approval_pb2.Reject(reason="no"))
            assert info.value.code() == grpc.StatusCode.ABORTED
            assert f"approved by {ALICE}" in info.value.details()
    finally:
        await server.stop(grace=0)


async def test_where_the_policy_names_nobody_a_signed_in_admin_decides(pool):
    _, approval_id = await hold_charge(pool, policy={"on_expiry": "reject"})
    assert await pool.fetchval("SELECT approvers FROM approvals") == ["admin"]
    for who in (person(ALICE, "approver"), person(ALICE), key("admin", "approver")):
        with pytest.raises(PermissionDenied):
            await decide_as(pool, approval_id, who)
    row = await decide_as(pool, approval_id, person(ALICE, "admin"))
    assert (row.decision, row.decided_by) == ("approved", ALICE)
