"""Every RPC x every kind of caller, generated from the service descriptors.

No RPC can be forgotten: the matrix walks every service the server
registers, and an RPC missing from control_plane/auth/access.py fails the
test. Every refusal writes nothing; no key's secret appears in any answer.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory

from control_plane.auth import keys
from control_plane.auth.access import ACCESS, Need
from control_plane.server import SERVICE_NAMES
from control_plane.store import identity as store
from tests.harness.auth import executor_key, platform_key, workspace_key

CODE = grpc.StatusCode
TABLES = (
    "workspaces",
    "agents",
    "agent_versions",
    "runs",
    "steps",
    "triggers",
    "trigger_secrets",
    "sessions",
    "session_turns",
    "approvals",
    "api_keys",
    "workspace_members",
    "audit_log",
    "credit_accounts",
    "credit_ledger",
)
# A caller that holds everything but what the method needs.
LACKING = {
    Need.READ: "executor",
    Need.OPERATE: "reader",
    Need.ADMIN: "operator",
    Need.DECIDE: "admin",
    Need.EXECUTOR: "admin",
    Need.PLATFORM: "admin",
    Need.ADMIN_OR_PLATFORM: "operator",
}
ROLES_AND_KINDS = ("admin", "operator", "reader", "approver", "executor", "platform")
ALLOWED = {
    Need.READ: {"admin", "operator", "reader", "approver"},
    Need.OPERATE: {"admin", "operator"},
    Need.ADMIN: {"admin"},
    Need.DECIDE: {"approver"},
    Need.EXECUTOR: {"executor"},
    Need.PLATFORM: {"platform"},
    Need.ADMIN_OR_PLATFORM: {"admin", "platform"},
}
RIGHT = {
    Need.READ: "reader",
    Need.OPERATE: "operator",
    Need.ADMIN: "admin",
    Need.DECIDE: "approver",
    Need.EXECUTOR: "executor",
    Need.PLATFORM: "platform",
    Need.ADMIN_OR_PLATFORM: "admin",
}


def methods():
    """(full method name, method descriptor) of every service the server registers."""
    pool = descriptor_pool.Default()  # control_plane.server imported every *_pb2
    for service_name in SERVICE_NAMES:
        service = pool.FindServiceByName(service_name)
        for method in service.methods:
            yield f"/{service.full_name}/{method.name}", method


def test_the_table_says_what_the_issue_asks():
    """Pinned intent, so the table cannot drift quietly."""
    by_need = {need: {n.rsplit("/", 1)[1] for n, x in ACCESS.items() if x is need} for need in Need}
    assert {
        "StartRun",
        "CancelRun",
        "ResolveUnknownOutcome",
        "SendMessage",
        "SignalRun",
    } <= by_need[Need.OPERATE]
    assert {
        "PublishAgentVersion",
        "CreateTrigger",
        "RotateTriggerSecret",
        "SetTriggerEnabled",
    } <= by_need[Need.ADMIN]
    assert by_need[Need.DECIDE] == {"DecideApproval"}
    assert by_need[Need.EXECUTOR] == {
        "Connect",
        "PutPayloadChunk",
        "GetPayloadSlice",
        "GetConnectionToken",
    }
    # Workspaces and credit grants; deploys (releases and the contract canary, issues 15, 41).
    assert {
        "CreateWorkspace",
        "SetWorkspacePlan",
        "GrantCredits",
        "ListReleases",
        "GetRelease",
        "DrainRelease",
        "PromoteRelease",
        "RampRelease",
        "RollbackRelease",
        "MoveRunRelease",
        "BulkMoveRunsRelease",
        "RunCanary",
    } == by_need[Need.PLATFORM]


def test_every_rpc_is_classified_and_nothing_else_is():
    names = {name for name, _ in methods()}
    assert names - ACCESS.keys() == set(), "unclassified RPCs"
    assert ACCESS.keys() - names == set(), "the table names RPCs that do not exist"


async def expired_key(db_url: str) -> str:
    new = keys.generate("workspace")
    past = datetime.now(UTC) - timedelta(hours=1)
    row = store.NewKeyRow(
        new.key_id,
        "workspace",
        "acme",
        "admin",
        "old",
        None,
        new.digest,
        "test",
        expires_at=past + timedelta(minutes=1),
    )
    conn = await asyncpg.connect(db_url)
    try:
        await store.insert_key(conn, row, now=past)
    finally:
        await conn.close()
    return new.text


@pytest.fixture
async def callers(db_url):
    found = {
        role: await workspace_key(db_url, "acme", role=role)
        for role in ("admin", "operator", "reader", "approver")
    }
    found["executor"] = await executor_key(db_url)
    found["platform"] = await platform_key(db_url)
    found["other workspace"] = await workspace_key(db_url, "other")
    found["expired"] = await expired_key(db_url)
    revoked = await workspace_key(db_url, "acme")
    conn = await asyncpg.connect(db_url)
    try:
        await store.revoke_key(conn, keys.parse(revoked).key_id, "acme")
    finally:
        await conn.close()
    found["revoked"] = revoked
    found["garbage"] = "agr_ws_0123456789abcdef_" + "x" * 43
    return found


async def call(channel, name: str, method, key: str | None) -> grpc.StatusCode:
    """Call `name` with an empty request (workspace_id "acme" where it has one)."""
    request_cls = message_factory.GetMessageClass(method.input_type)
    response_cls = message_factory.GetMessageClass(method.output_type)
    request = request_cls()
    if "workspace_id" in request_cls.DESCRIPTOR.fields_by_name:
        request.workspace_id = "acme"
    metadata = (("authorization", f"Bearer {key}"),) if key else ()
    ser, de = request_cls.SerializeToString, response_cls.FromString
    try:
        if method.client_streaming:
            stream = channel.stream_stream(name, ser, de)(metadata=metadata, timeout=10)
            await stream.done_writing()
            async for _ in stream:
                pass
        elif method.server_streaming:
            async for _ in channel.unary_stream(name, ser, de)(
                request, metadata=metadata, timeout=10
            ):
                break
        else:
            await channel.unary_unary(name, ser, de)(request, metadata=metadata, timeout=10)
    except grpc.aio.AioRpcError as err:
        call.details.append(err.details() or "")
        return err.code()
    return CODE.OK


call.details = []  # type: ignore[attr-defined]


async def counts(db) -> dict[str, int]:
    return {t: await db.fetchval(f"SELECT count(*) FROM {t}") for t in TABLES}


async def test_every_rpc_refuses_every_wrong_caller_and_serves_the_right_one(server, db, callers):
    expected_refusals = {
        None: CODE.UNAUTHENTICATED,
        "garbage": CODE.UNAUTHENTICATED,
        "revoked": CODE.UNAUTHENTICATED,
        "expired": CODE.UNAUTHENTICATED,
        "other workspace": CODE.PERMISSION_DENIED,
    }
    before = await counts(db)
    got: dict[tuple[str, str], grpc.StatusCode] = {}
    want: dict[tuple[str, str], grpc.StatusCode] = {}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        for name, method in methods():
            need = ACCESS[name]
            cases = dict(expected_refusals)
            for role in ROLES_AND_KINDS:  # every caller the table does not allow
                if role not in ALLOWED[need]:
                    cases[role] = CODE.PERMISSION_DENIED
            assert LACKING[need] in cases
            for who, code in cases.items():
                key = callers[who] if who else None
                got[(name, str(who))] = await call(channel, name, method, key)
                want[(name, str(who))] = code
        assert got == want
        assert await counts(db) == before, "a refused call wrote something"
        for name, method in methods():
            code = await call(channel, name, method, callers[RIGHT[ACCESS[name]]])
            assert code not in (CODE.UNAUTHENTICATED, CODE.PERMISSION_DENIED), (name, code)
    # No answer ever carried a key's secret.
    secrets = [keys.parse(k).secret for k in callers.values() if keys.parse(k)]
    for details in call.details:
        assert not any(s in details for s in secrets), details
