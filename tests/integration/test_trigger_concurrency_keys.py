"""Keys declared on a trigger (issue 45, item 3: "an agent version (or a trigger)"): a
trigger's `concurrency_key` caps the runs it starts per value of a path in the event it
received (a webhook's JSON body), overriding the agent version's own rule for those runs;
the agent's other runs keep the version's. Real control plane, real Postgres, real signed
HTTP deliveries; nothing claims, so the slots stay as admitted."""

from __future__ import annotations

import json
import uuid

import grpc
import httpx
import pytest

from agentrun.v1 import agent_pb2, run_pb2, run_pb2_grpc, trigger_pb2
from control_plane.ground.config import ServerConfig
from control_plane.server import start
from tests.harness.cli import agentrun_async
from tests.harness.triggers import SCHEME, TriggerApi, post, seconds, signed

WS = "ws"


@pytest.fixture
async def server(db_url):
    running = await start(ServerConfig(database_url=db_url, listen="127.0.0.1:0"))
    yield running
    await running.stop(grace=0)


@pytest.fixture
async def api(server, db_url):
    client = await TriggerApi.connect(f"127.0.0.1:{server.port}", db_url, WS)
    # The version keys by tenant, 5 at once: the trigger's own rule replaces it for its runs.
    await client.agents.CreateAgent(agent_pb2.CreateAgentRequest(workspace_id=WS, agent_id="bill"))
    spec = agent_pb2.AgentSpec(
        model="writer",
        instructions="test agent",
        concurrency_key=agent_pb2.ConcurrencyKey(key="input.tenant", limit=5),
    )
    await client.agents.PublishAgentVersion(
        agent_pb2.PublishAgentVersionRequest(workspace_id=WS, agent_id="bill", spec=spec)
    )
    yield client
    await client.close()


def keyed_hook(trigger_id: str, **key: object) -> trigger_pb2.CreateTriggerRequest:
    return trigger_pb2.CreateTriggerRequest(
        workspace_id=WS,
        trigger_id=trigger_id,
        agent_id="bill",
        webhook=trigger_pb2.WebhookSource(scheme=SCHEME["hmac_sha256"]),
        concurrency_key=agent_pb2.ConcurrencyKey(**key),  # type: ignore[arg-type]
    )


async def test_a_trigger_key_caps_the_runs_it_starts_per_customer_over_the_versions_rule(
    api, server, db
):
    made = await api.triggers.CreateTrigger(keyed_hook("paid", key="input.data.customer", limit=1))
    assert made.trigger.concurrency_key == agent_pb2.ConcurrencyKey(
        key="input.data.customer", limit=1
    )
    shown = await api.triggers.GetTrigger(
        trigger_pb2.GetTriggerRequest(workspace_id=WS, trigger_id="paid")
    )
    assert shown.trigger.concurrency_key.limit == 1
    deliveries = [("acme", 0), ("acme", 1), ("acme", 2), ("globex", 3)]
    run_ids = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as http:
        for customer, n in deliveries:
            doc = {"type": "invoice.paid", "tenant": "t1", "data": {"customer": customer}}
            body, headers = signed("hmac_sha256", made.secret, doc, f"delivery-{n}")
            reply = await post(http, WS, "paid", body, headers)
            assert reply.status_code == 202, reply.text
            run_ids.append(reply.json()["run_id"])
    runs = run_pb2_grpc.RunServiceStub(api.channel)
    got = [
        (await runs.GetRun(run_pb2.GetRunRequest(workspace_id=WS, run_id=r))).run for r in run_ids
    ]
    # Keyed by the delivery's customer (the version's tenant rule, 5 at once, would have let
    # all four start): one of acme's holds the slot, the other two wait for it.
    assert [r.concurrency_key for r in got] == ["acme", "acme", "acme", "globex"]
    assert [(r.status, r.wait_reason) for r in got] == [
        (run_pb2.RUN_STATUS_QUEUED, ""),
        (run_pb2.RUN_STATUS_WAITING, "concurrency_key"),
        (run_pb2.RUN_STATUS_WAITING, "concurrency_key"),
        (run_pb2.RUN_STATUS_QUEUED, ""),
    ]
    assert got[2].queue.cause == run_pb2.QUEUE_WAIT_CAUSE_CONCURRENCY_KEY
    assert got[2].queue.runs_ahead == 1
    # The agent's other runs keep the version's rule.
    started = await runs.StartRun(
        run_pb2.StartRunRequest(
            workspace_id=WS, agent_id="bill", input=json.dumps({"tenant": "t1"})
        )
    )
    assert (started.run.status, started.run.concurrency_key) == (run_pb2.RUN_STATUS_QUEUED, "t1")
    limits = dict(
        await db.fetch("SELECT key, slot_limit FROM concurrency_keys WHERE workspace_id = $1", WS)
    )
    assert limits == {"acme": 1, "globex": 1, "t1": 5}
    # A holder's end passes its slot to the next of the trigger's runs, as any key does.
    await runs.CancelRun(run_pb2.CancelRunRequest(workspace_id=WS, run_id=run_ids[0]))
    nxt = (await runs.GetRun(run_pb2.GetRunRequest(workspace_id=WS, run_id=run_ids[1]))).run
    assert nxt.status == run_pb2.RUN_STATUS_QUEUED
    row = await db.fetchrow(
        "SELECT key_rule FROM runs WHERE workspace_id = $1 AND run_id = $2",
        WS,
        uuid.UUID(run_ids[1]),
    )
    assert json.loads(row["key_rule"])["value"] == "acme"


async def test_a_schedule_keeps_its_key_through_an_update_and_keys_by_its_json_input(api, db):
    hourly = trigger_pb2.ScheduleSource(
        interval=seconds(3600), input=json.dumps({"customer_id": "c-9"})
    )
    await api.triggers.CreateTrigger(
        trigger_pb2.CreateTriggerRequest(
            workspace_id=WS,
            trigger_id="hourly",
            agent_id="bill",
            schedule=hourly,
            concurrency_key=agent_pb2.ConcurrencyKey(key="input.customer_id", limit=1),
        )
    )
    update = trigger_pb2.UpdateScheduleRequest(
        workspace_id=WS, trigger_id="hourly", schedule=hourly
    )
    kept = (await api.triggers.UpdateSchedule(update)).trigger.concurrency_key
    assert (kept.key, kept.limit) == ("input.customer_id", 1)
    for _ in range(2):
        await api.triggers.TriggerScheduleNow(
            trigger_pb2.TriggerScheduleNowRequest(
                workspace_id=WS,
                trigger_id="hourly",
                overlap_policy=trigger_pb2.SCHEDULE_OVERLAP_POLICY_ALLOW_ALL,
            )
        )
    rows = await db.fetch(
        "SELECT concurrency_key, status FROM runs WHERE workspace_id = $1 ORDER BY created_at",
        WS,
    )
    assert [tuple(r) for r in rows] == [("c-9", "queued"), ("c-9", "waiting")]


@pytest.mark.parametrize(
    ("key", "extra", "field"),
    [
        ({"limit": 2}, {}, "concurrency_key.key"),
        ({"key": "customer_id", "limit": 2}, {}, "concurrency_key.key"),
        ({"key": "input.customer_id"}, {}, "concurrency_key.limit"),
        (
            {"key": "input.c", "limit": 1, "rate": agent_pb2.KeyRate(per_seconds=0, runs=1)},
            {},
            "concurrency_key.rate.per_seconds",
        ),
        ({"key": "input.c", "limit": 1}, {"publish_event": "invoice.paid"}, "concurrency_key"),
    ],
)
async def test_a_bad_trigger_key_is_refused_naming_the_field(api, key, extra, field):
    req = keyed_hook("bad", **key)
    for name, value in extra.items():
        setattr(req, name, value)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await api.triggers.CreateTrigger(req)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(field), err.value.details()


async def test_the_cli_declares_and_shows_a_trigger_key(api, server):
    argv = ["triggers", "create", "orders", "--agent", "bill", "--webhook", "hmac"]
    key = ["--concurrency-key", "input.customer_id", "--key-limit", "2", "--key-rate", "10/60"]
    address = f"127.0.0.1:{server.port}"
    done = await agentrun_async(address, api.key, *argv, *key, workspace=WS)
    assert done.returncode == 0, done.stderr
    assert "key       input.customer_id: 2 at once, 10 per 60s" in done.stdout
    got = await api.triggers.GetTrigger(
        trigger_pb2.GetTriggerRequest(workspace_id=WS, trigger_id="orders")
    )
    assert got.trigger.concurrency_key == agent_pb2.ConcurrencyKey(
        key="input.customer_id", limit=2, rate=agent_pb2.KeyRate(per_seconds=60, runs=10)
    )
    bad = await agentrun_async(
        address, api.key, *argv[:3], "orders2", *argv[4:], "--key-rate", "ten", workspace=WS
    )
    assert bad.returncode != 0 and "--key-rate" in bad.stderr
