"""Events by matching with real processes (issue 45, item 2): RunService.PublishEvent (and
`agentrun events publish`, and POST /v1/workspaces/{ws}/events) wakes exactly the runs whose
wait_for_event call it matches, through an index; a duplicate event id wakes nothing more;
the look-back window catches an earlier event and not an older one; a timeout, any and all
of several events; an agent version's cancel_on cancels its matching runs; a webhook
trigger publishes its deliveries as events; bad input is refused naming the field."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import asyncpg
import grpc
import httpx
import pytest

from agentrun.v1 import agent_pb2, run_pb2, trigger_pb2
from tests.harness import auth
from tests.harness.agentrun_api import Api
from tests.harness.cli import agentrun_async
from tests.harness.triggers import SCHEME, TriggerApi, post, signed
from tests.harness.waiting import eventually

TOOL = "wait_for_event"
MATCH = "event.customer == run.input.customer"


@pytest.fixture
async def stack(db_url, control_plane, executor_factory, sandbox_model, sandbox_providers):
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url)
    for agent, scenario, tools in (
        ("payer", "events_wait", [TOOL]),
        ("sleeper", "events_sleeper", ["sleep"]),
        ("timer", "events_timeout", [TOOL]),
        ("looker", "events_lookback", [TOOL]),
        ("either", "events_any", [TOOL]),
        ("both", "events_all", [TOOL]),
        ("broken", "events_bad_match", [TOOL]),
    ):
        await api.publish(agent, scenario, tools)
    executor_factory(cp, AGENTRUN_CAPACITY="64")
    db = await asyncpg.connect(db_url)
    yield cp, api, db
    await db.close()
    await api.close()


async def publish(api: Api, name: str, event_id: str, body: Any) -> run_pb2.PublishEventResponse:
    return await api.runs.PublishEvent(
        run_pb2.PublishEventRequest(
            workspace_id=api.ws, event_name=name, event_id=event_id, body_json=json.dumps(body)
        )
    )


async def start(api: Api, agent: str, customer: str, **more: Any) -> str:
    return await api.start(agent, json.dumps({"customer": customer, **more}))


async def waiting(db: asyncpg.Connection, reason: str, run_ids: list[str]) -> int:
    return int(
        await db.fetchval(
            "SELECT count(*) FROM runs WHERE status = 'waiting' AND wait_reason = $1"
            " AND run_id = ANY($2::uuid[])",
            reason,
            run_ids,
        )
    )


async def all_waiting(db: asyncpg.Connection, reason: str, run_ids: list[str]) -> None:
    async def done() -> bool:
        return await waiting(db, reason, run_ids) == len(run_ids)

    await eventually(done, timeout=90, interval=0.3, message=f"runs never all waited ({reason})")


async def results(api: Api, run_id: str) -> list[dict[str, Any]]:
    return [
        s.payload
        for s in await api.steps(run_id)
        if s.kind == "tool_result" and s.payload["tool"] == TOOL
    ]


async def test_one_event_wakes_exactly_its_run_among_200_through_the_index(stack, db_url):
    cp, api, db = stack
    payers = [await start(api, "payer", f"c{i}") for i in range(200)]
    sleepers = [await api.start("sleeper", "zzz") for _ in range(50)]
    await all_waiting(db, "event", payers)
    await all_waiting(db, "sleep", sleepers)
    # The publish reads the waits by key: the planner uses the index, not a scan.
    plan = await db.fetchval(
        "EXPLAIN (FORMAT JSON) SELECT run_id FROM event_waits WHERE workspace_id = 'ws'"
        " AND event_name = 'invoice.paid' AND match_key = ANY($1::jsonb[])",
        [json.dumps([["customer", "c17"]])],
    )
    assert "event_waits_by_key" in json.dumps(plan), plan

    # Through the CLI: one event, one run woken, the body its call's result, once.
    key = await auth.workspace_key(db_url, "ws", role="operator")
    body = {"customer": "c17", "amount": 42}
    done = await agentrun_async(
        cp.address,
        key,
        "events",
        "publish",
        "invoice.paid",
        "--id",
        "inv-17",
        "--body",
        json.dumps(body),
        workspace="ws",
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "woke 1 run(s)" in done.stdout, done.stdout
    (run,) = await api.wait_terminal([payers[17]], within=30)
    assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    (result,) = await results(api, payers[17])
    assert result["output"]["body"] == body and result["output"]["event_id"] == "inv-17"
    assert not result["output"]["timed_out"]
    others = payers[:17] + payers[18:]
    assert await waiting(db, "event", others) == 199
    assert await waiting(db, "sleep", sleepers) == 50

    # The same id again (same body): accepted, nothing woken; another body: ALREADY_EXISTS.
    again = await publish(api, "invoice.paid", "inv-17", body)
    assert not again.created and again.event.woke == 1
    with pytest.raises(grpc.aio.AioRpcError) as used:
        await publish(api, "invoice.paid", "inv-17", {"customer": "c18"})
    assert used.value.code() == grpc.StatusCode.ALREADY_EXISTS
    # An event for nobody's customer, or of another name, wakes nothing.
    assert (await publish(api, "invoice.paid", "inv-x", {"customer": "nobody"})).event.woke == 0
    assert (await publish(api, "invoice.sent", "inv-y", {"customer": "c18"})).event.woke == 0
    await asyncio.sleep(0.5)
    assert await waiting(db, "event", others) == 199
    assert len(await results(api, payers[17])) == 1


async def test_look_back_timeout_any_and_all(stack):
    cp, api, db = stack
    # A timeout ends a wait that nothing answers (and shows the executor is ready).
    timer = await start(api, "timer", "nobody")
    (timed,) = await api.wait_terminal([timer], within=60)
    (result,) = await results(api, timer)
    assert result["output"]["timed_out"] is True and result["output"]["events"] == []
    assert timed.status == run_pb2.RUN_STATUS_COMPLETED
    # Look-back (3 s before the call): an older event is not caught, a recent one is.
    await publish(api, "invoice.paid", "old", {"customer": "old"})
    # Published 10 s ago, as the database sees it: out of the window (no waiting it out).
    # (Read, then written as a value: Citus refuses a stable function over a column in
    # an UPDATE across shards.)
    old_at = await db.fetchval("SELECT published_at FROM events WHERE event_id = 'old'")
    await db.execute(
        "UPDATE events SET published_at = $1 WHERE event_id = 'old'",
        old_at - timedelta(seconds=10),
    )
    await publish(api, "invoice.paid", "recent", {"customer": "recent"})
    recent = await start(api, "looker", "recent")
    old = await start(api, "looker", "old")
    (caught,) = await api.wait_terminal([recent], within=30)
    assert caught.status == run_pb2.RUN_STATUS_COMPLETED, caught.error
    assert (await results(api, recent))[0]["output"]["event_id"] == "recent"
    await all_waiting(db, "event", [old])
    # Any: the first of two names; all: each of two, the second matched on a literal too.
    either = await start(api, "either", "a")
    both = await start(api, "both", "b")
    await all_waiting(db, "event", [old, either, both])
    assert (await publish(api, "invoice.voided", "v-a", {"customer": "a"})).event.woke == 1
    (done,) = await api.wait_terminal([either], within=30)
    out = (await results(api, either))[0]["output"]
    assert out["name"] == "invoice.voided" and [e["slot"] for e in out["events"]] == [1]
    assert (await publish(api, "invoice.paid", "p-b", {"customer": "b"})).event.woke == 0
    wrong_carrier = {"customer": "b", "carrier": "van"}
    assert (await publish(api, "shipment.sent", "s-b1", wrong_carrier)).event.woke == 0
    await asyncio.sleep(0.3)
    assert await waiting(db, "event", [both]) == 1
    sent = await publish(api, "shipment.sent", "s-b2", {"customer": "b", "carrier": "post"})
    assert sent.event.woke == 1
    (done,) = await api.wait_terminal([both], within=30)
    out = (await results(api, both))[0]["output"]
    assert [(e["slot"], e["event_id"]) for e in out["events"]] == [(0, "p-b"), (1, "s-b2")]
    # The old run still waits, and a new event of its customer wakes it.
    await publish(api, "invoice.paid", "old-2", {"customer": "old"})
    (woken,) = await api.wait_terminal([old], within=30)
    assert (await results(api, old))[0]["output"]["event_id"] == "old-2"


async def test_cancel_on_http_publish_and_bad_input(stack, db_url):
    cp, api, db = stack
    spec = agent_pb2.AgentSpec(
        model="events_wait",
        instructions="test agent",
        tools=[TOOL],
        cancel_on=[
            agent_pb2.CancelOn(event="order.cancelled", match="event.order == run.input.order")
        ],
    )
    await api.agents.PublishAgentVersion(
        agent_pb2.PublishAgentVersionRequest(workspace_id="ws", agent_id="payer", spec=spec)
    )
    doomed = await start(api, "payer", "d1", order="o1")
    spared = await start(api, "payer", "d2", order="o2")
    await all_waiting(db, "event", [doomed, spared])
    # Over HTTP: the body is a JSON object in the request.
    key = await auth.workspace_key(db_url, "ws", role="operator")
    async with httpx.AsyncClient(headers=auth.bearer(key), timeout=30) as http:
        url = f"{cp.http_url}/v1/workspaces/ws/events"
        sent = await http.post(
            url, json={"event_name": "order.cancelled", "event_id": "oc-1", "body": {"order": "o1"}}
        )
        assert sent.status_code == 201, sent.text
        assert sent.json()["event"]["cancelled"] == 1
        assert sent.json()["event"]["body"] == {"order": "o1"}
        again = await http.post(
            url, json={"event_name": "order.cancelled", "event_id": "oc-1", "body": {"order": "o1"}}
        )
        assert again.status_code == 200 and again.json()["created"] is False
        for bad, field in (
            ({"event_name": "x", "event_id": "e", "body": [1]}, "body"),
            ({"event_name": "x", "event_id": "e", "body": "text"}, "body"),
            ({"event_name": "no spaces", "event_id": "e", "body": {}}, "event_name"),
            ({"event_name": "x", "event_id": "", "body": {}}, "event_id"),
        ):
            refused = await http.post(url, json=bad)
            assert refused.status_code == 400, (bad, refused.text)
            assert refused.json()["field"] == field, (bad, refused.json())
    (cancelled,) = await api.wait_terminal([doomed], within=30)
    assert cancelled.status == run_pb2.RUN_STATUS_CANCELLED
    assert "order.cancelled" in cancelled.error
    assert (await api.get(spared)).status == run_pb2.RUN_STATUS_WAITING
    # A webhook trigger can publish its deliveries as events instead of starting runs: the
    # delivery wakes the run waiting for its customer; a redelivery wakes nothing more.
    hooks = await TriggerApi.connect(cp.address, db_url)
    try:
        source = trigger_pb2.WebhookSource(scheme=SCHEME["hmac_sha256"])
        _, secret = await hooks.create(
            "paid", "payer", webhook=source, publish_event="invoice.paid"
        )
    finally:
        await hooks.close()
    body, headers = signed("hmac_sha256", secret, {"customer": "d2", "paid": True}, "dlv-1")
    async with httpx.AsyncClient(base_url=cp.http_url, timeout=30) as client:
        first = await post(client, "ws", "paid", body, headers)
        assert first.status_code == 202 and first.json()["status"] == "published", first.text
        assert first.json()["woke"] == 1
        again = await post(client, "ws", "paid", body, headers)
        assert again.json() == {**first.json(), "status": "duplicate"}
    (paid,) = await api.wait_terminal([spared], within=30)
    assert paid.status == run_pb2.RUN_STATUS_COMPLETED, paid.error
    (result,) = await results(api, spared)
    assert result["output"]["body"] == {"customer": "d2", "paid": True}
    # gRPC: a body that is not an object names body_json.
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await publish(api, "invoice.paid", "e", [1, 2])
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "body_json" in (bad.value.details() or "")
    # An agent version whose cancel_on expression does not parse is refused naming it.
    spec.cancel_on[0].match = "event.order > 3"
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        await api.agents.PublishAgentVersion(
            agent_pb2.PublishAgentVersionRequest(workspace_id="ws", agent_id="payer", spec=spec)
        )
    assert unknown.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "spec.cancel_on[0].match" in (unknown.value.details() or "")
    # A wait whose expression does not parse is the call's error, which the model reads.
    broken = await start(api, "broken", "x")
    (run,) = await api.wait_terminal([broken], within=30)
    (result,) = await results(api, broken)
    assert result["status"] == "error" and "match" in result["error"]
