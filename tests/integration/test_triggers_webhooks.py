"""Webhook ingress against a real control plane and Postgres: dedupe, signatures, refusals, filters."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid

import grpc
import httpx
import pytest

from agentrun.v1 import trigger_pb2
from control_plane.ground.config import ServerConfig
from control_plane.server import start
from control_plane.triggers.signatures import sign
from tests.harness.cli import agentrun_async
from tests.harness.triggers import TriggerApi, count, post, seconds, signed

WS = "ws"
SCHEMES = ["hmac_sha256", "stripe", "slack", "github", "standard_webhooks"]


@pytest.fixture
async def server(db_url):
    config = ServerConfig(database_url=db_url, listen="127.0.0.1:0", webhook_max_body_bytes=4096)
    running = await start(config)
    yield running
    await running.stop(grace=0)


@pytest.fixture
async def api(server, db_url):
    client = await TriggerApi.connect(f"127.0.0.1:{server.port}", db_url, WS)
    await client.publish("triage")
    yield client
    await client.close()


@pytest.fixture
async def http(server):
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}", timeout=10) as c:
        yield c


def event_doc(scheme: str, n: int) -> dict:
    """A body as the scheme's sender would send it (Stripe and Slack carry their id inside)."""
    if scheme == "stripe":
        return {"id": f"evt_{n}", "object": "event", "type": "invoice.paid"}
    if scheme == "slack":
        return {"type": "event_callback", "event_id": f"Ev{n:08d}", "event": {"type": "message"}}
    return {"action": "opened", "number": n}


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_each_delivery_replayed_three_times_starts_exactly_one_run(api, http, db, scheme):
    secret = await api.webhook("hook", "triage", scheme)
    replies: dict[int, list[httpx.Response]] = {}
    for n in range(4):
        body, headers = signed(scheme, secret, event_doc(scheme, n), f"delivery-{n}")
        sequential = [await post(http, WS, "hook", body, headers) for _ in range(3)]
        concurrent = await asyncio.gather(
            *(post(http, WS, "hook", body, headers) for _ in range(3))
        )
        replies[n] = [*sequential, *concurrent]
    for n, answers in replies.items():
        assert {r.status_code for r in answers} == {202}, [r.text for r in answers]
        assert len({r.content for r in answers}) == 1, f"delivery {n}: replies differ"
        assert answers[0].json()["status"] == "accepted" and answers[0].json()["run_id"]
    run_ids = {answers[0].json()["run_id"] for answers in replies.values()}
    assert len(run_ids) == 4
    assert await count(db, "runs", workspace_id=WS) == 4
    assert await count(db, "trigger_events", workspace_id=WS) == 4
    events = await api.events("hook")
    assert {e.run_id for e in events} == run_ids


async def test_the_run_gets_the_event_as_input_and_its_origin(api, http, db):
    secret = await api.webhook("gh", "triage", "github")
    body, headers = signed("github", secret, {"action": "opened"}, "72d3162e-cc78")
    reply = (await post(http, WS, "gh", body, headers)).json()
    row = await db.fetchrow(
        "SELECT r.status, r.started_by, s.payload FROM runs r "
        "JOIN steps s USING (workspace_id, run_id) WHERE r.run_id = $1 AND s.seq = 0",
        uuid.UUID(reply["run_id"]),
    )
    payload = json.loads(row["payload"])
    assert (row["status"], row["started_by"]) == ("queued", "trigger:gh")
    assert payload["trigger"] == {
        "trigger_id": "gh",
        "kind": "webhook",
        "dedupe_key": "72d3162e-cc78",
        "chain_depth": 0,
    }
    assert '"action": "opened"' in payload["text"]


async def test_forged_stale_and_rotated_out_signatures_are_refused(api, http, db):
    old = await api.webhook("stripe", "triage", "stripe")
    doc = event_doc("stripe", 1)

    async def deliver(secret: str, n: int, *, age: int = 0) -> httpx.Response:
        body, headers = signed(
            "stripe", secret, {**doc, "id": f"evt_{n}"}, "", timestamp=int(time.time()) - age
        )
        return await post(http, WS, "stripe", body, headers)

    forged = await deliver("whsec_" + "0" * 64, 1)
    stale = await deliver(old, 2, age=301)  # Stripe's tolerance is 300 s
    assert (forged.status_code, stale.status_code) == (401, 401)
    assert "does not match" in forged.json()["error"] and "tolerance" in stale.json()["error"]
    assert (await deliver(old, 3, age=290)).status_code == 202

    new = await api.rotate("stripe", grace=3600)  # both verify during the grace period
    assert [(await deliver(s, n)).status_code for n, s in ((4, old), (5, new))] == [202, 202]
    trigger = (
        await api.triggers.GetTrigger(
            trigger_pb2.GetTriggerRequest(workspace_id=WS, trigger_id="stripe")
        )
    ).trigger
    assert [s.secret_id for s in trigger.secrets] == [1, 2] and trigger.secrets[0].HasField(
        "expire_time"
    )

    newest = await api.rotate("stripe", grace=0)  # retires `new` now, and `old` with it
    rotated_out = [(await deliver(s, n)).status_code for n, s in ((6, old), (7, new))]
    assert rotated_out == [401, 401]
    assert (await deliver(newest, 8)).status_code == 202
    accepted = {e.dedupe_key for e in await api.events("stripe")}
    assert accepted == {"evt_3", "evt_4", "evt_5", "evt_8"}
    assert await count(db, "runs", workspace_id=WS) == 4


async def test_refusals_store_nothing(api, http, db):
    secret = await api.webhook("hook", "triage", "hmac_sha256")
    body, headers = signed("hmac_sha256", secret, {"a": 1}, "d-1")
    unknown = await post(http, WS, "nope", body, headers)
    other_ws = await post(http, "elsewhere", "hook", body, headers)
    bad_id = await post(http, WS, "Not A Slug", body, headers)
    big_body, big_headers = signed("hmac_sha256", secret, {"pad": "x" * 5000}, "d-2")
    too_big = await post(http, WS, "hook", big_body, big_headers)
    raw = b"{not json"
    garbage_headers = {
        **sign("hmac_sha256", secret, raw, timestamp=int(time.time())),
        "X-Webhook-Id": "d-3",
    }
    garbage = await post(http, WS, "hook", raw, garbage_headers)
    no_id = {k: v for k, v in headers.items() if k != "X-Webhook-Id"}
    missing_id = await post(http, WS, "hook", body, no_id)
    assert [r.status_code for r in (unknown, other_ws, bad_id, too_big, garbage, missing_id)] == [
        404,
        404,
        404,
        413,
        400,
        400,
    ]
    assert garbage.json()["error"] == "body: is not valid JSON"
    assert "X-Webhook-Id".lower() in missing_id.json()["error"]
    assert await count(db, "trigger_events") == 0 and await count(db, "runs") == 0


async def test_a_disabled_trigger_answers_404(api, http, db):
    secret = await api.webhook("hook", "triage", "github")
    await api.triggers.SetTriggerEnabled(
        trigger_pb2.SetTriggerEnabledRequest(workspace_id=WS, trigger_id="hook", enabled=False)
    )
    body, headers = signed("github", secret, {"a": 1}, "d-1")
    assert (await post(http, WS, "hook", body, headers)).status_code == 404
    assert await count(db, "trigger_events") == 0


async def test_filtered_events_are_recorded_visibly_and_start_no_run(api, http, db):
    only_paid = trigger_pb2.FilterRule(
        field="type", op=trigger_pb2.FILTER_OP_EQUALS, value="invoice.paid"
    )
    secret = await api.webhook("stripe", "triage", "stripe", filters=[only_paid])
    paid, _ = signed("stripe", secret, {"id": "evt_1", "type": "invoice.paid"}, "")
    failed_doc = {"id": "evt_2", "type": "charge.failed"}
    replies = []
    for _ in range(2):  # a redelivery of the filtered event gets the same answer
        body, headers = signed("stripe", secret, failed_doc, "")
        replies.append(await post(http, WS, "stripe", body, headers))
    body, headers = signed("stripe", secret, {"id": "evt_1", "type": "invoice.paid"}, "")
    accepted = await post(http, WS, "stripe", body, headers)
    assert replies[0].content == replies[1].content
    assert replies[0].json() | {"event_id": ""} == {
        "event_id": "",
        "status": "filtered",
        "reason": "filters[0]: type equals invoice.paid",
    }
    assert accepted.json()["status"] == "accepted"
    events = {e.dedupe_key: e for e in await api.events("stripe")}
    assert events["evt_2"].status == trigger_pb2.TRIGGER_EVENT_STATUS_FILTERED
    assert events["evt_2"].run_id == "" and events["evt_2"].reason
    assert json.loads(events["evt_2"].payload_json)["type"] == "charge.failed"
    assert await count(db, "runs") == 1


async def test_slack_url_verification_echoes_the_challenge_and_stores_nothing(api, http, db):
    secret = await api.webhook("slack", "triage", "slack")
    doc = {
        "token": "Jhj5dZrVaK7ZwHHjRyZWjbDl",
        "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
        "type": "url_verification",
    }
    body, headers = signed("slack", secret, doc, "")
    reply = await post(http, WS, "slack", body, headers)
    assert (reply.status_code, reply.json()) == (200, {"challenge": doc["challenge"]})
    assert await count(db, "trigger_events") == 0


async def test_secrets_never_appear_in_reads_errors_or_logs(api, http, caplog):
    caplog.set_level(logging.DEBUG)
    secret = await api.webhook("hook", "triage", "github", secret="s3cr3t-github-hook-key")
    assert secret == "s3cr3t-github-hook-key"
    trigger = (
        await api.triggers.GetTrigger(
            trigger_pb2.GetTriggerRequest(workspace_id=WS, trigger_id="hook")
        )
    ).trigger
    listed = await api.triggers.ListTriggers(trigger_pb2.ListTriggersRequest(workspace_id=WS))
    body, headers = signed("github", "some-other-secret", {"a": 1}, "d-1")
    refused = await post(http, WS, "hook", body, headers)
    assert refused.status_code == 401
    for text in (str(trigger), str(listed), refused.text, caplog.text):
        assert secret not in text


@pytest.mark.parametrize(
    ("source", "field"),
    [
        ({"webhook": trigger_pb2.WebhookSource()}, "webhook.scheme"),
        ({"webhook": trigger_pb2.WebhookSource(scheme=2, untimed=True)}, "webhook.untimed"),
        (
            {"webhook": trigger_pb2.WebhookSource(scheme=1, tolerance=seconds(0.5))},
            "webhook.tolerance",
        ),
        ({"webhook": trigger_pb2.WebhookSource(scheme=5), "secret": "not base64!!"}, "secret"),
        ({}, "source"),
        ({"schedule": trigger_pb2.ScheduleSource(cron="* *")}, "schedule.cron"),
        ({"mail_push": trigger_pb2.MailPushSource(history_url="ftp://x")}, "mail_push.history_url"),
        ({"mail": trigger_pb2.MailSource(max_chain_depth=99)}, "mail.max_chain_depth"),
        (
            {
                "webhook": trigger_pb2.WebhookSource(scheme=1),
                "filters": [trigger_pb2.FilterRule(field="a")],
            },
            "filters[0]",
        ),
    ],
)
async def test_bad_trigger_definitions_are_refused_naming_the_field(api, db, source, field):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await api.create("bad", "triage", **source)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(f"{field}:"), info.value.details()
    assert await count(db, "triggers") == 0


async def test_triggers_need_a_published_agent_and_a_free_id(api):
    secret = await api.webhook("hook", "triage", "github")
    assert secret.startswith("whsec_")
    with pytest.raises(grpc.aio.AioRpcError) as taken:
        await api.webhook("hook", "triage", "github")
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await api.webhook("hook2", "nobody", "github")
    assert taken.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


async def cli(server, key: str, *argv: str) -> str:
    """Run `agentrun …` against the in-process server; what it printed (it must succeed)."""
    done = await agentrun_async(f"127.0.0.1:{server.port}", key, *argv, workspace=WS)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_the_triggers_cli_creates_lists_and_shows_events(api, http, server):
    created = await cli(
        server,
        api.key,
        "triggers",
        "create",
        "gh",
        "--agent",
        "triage",
        "--webhook",
        "github",
        "--filter",
        "action equals opened",
    )
    secret = re.search(r"signing secret \(shown once\): (\S+)", created).group(1)
    assert "url       POST http://" in created and "/hooks/ws/gh" in created
    for n, action in enumerate(["opened", "closed"]):
        body, headers = signed("github", secret, {"action": action}, f"d-{n}")
        assert (await post(http, WS, "gh", body, headers)).status_code == 202
    events = await cli(server, api.key, "triggers", "events", "gh")
    assert re.search(r"accepted\s+d-0\s+run [0-9a-f-]{36}", events)
    assert re.search(r"filtered\s+d-1\s+filters\[0\]: action equals opened", events)
    shown = await cli(server, api.key, "triggers", "show", "gh")
    assert "secret    #1" in shown and secret not in shown
    listed = await cli(server, api.key, "triggers", "list")
    assert listed.splitlines()[1].startswith("gh") and "webhook (github)" in listed
    rotated = await cli(server, api.key, "triggers", "rotate-secret", "gh", "--grace", "0")
    assert "new signing secret (shown once)" in rotated and "secret    #2" in rotated
