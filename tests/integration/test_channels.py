"""Workspace channels (issue 43): Slack's Web API, SMTP, and signed webhooks retried under one id."""

from __future__ import annotations

import asyncio
import json
import uuid

import grpc
import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from agentrun.v1 import channel_pb2, channel_pb2_grpc
from control_plane.approvals import needs_help, relay
from control_plane.channels import lifecycle, secrets
from control_plane.crypto import kms
from control_plane.crypto.envelope import Envelope
from control_plane.server import start
from control_plane.store import channels, outbox, runs
from sandbox.providers.slack_api import BOT_TOKEN
from tests import factories
from tests.harness import auth
from tests.harness.agentrun_api import sandbox_requests
from tests.harness.approval_routes import (  # noqa: F401 (fixtures)
    config_fixture,
    http_fixture,
    pool_fixture,
)
from tests.harness.cli import agentrun_async
from tests.harness.http_stub import Seen, reply, serving
from tests.harness.smtp import smtp_server
from tests.harness.waiting import eventually
from tests.integration.test_approvals import hold

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def local_envelope(pool) -> Envelope:
    return Envelope(pool, kms.configured("local", None, release="dev"))


async def add_webhook(pool, envelope, url: str, name: str = "hooks") -> uuid.UUID:
    await factories.agent_version(pool, "ws", "setup")  # the workspace
    cid = uuid.uuid4()
    sealed = await secrets.seal(envelope, "ws", cid, SECRET)
    await channels.insert(pool, "ws", cid, "webhook", name, {"url": url}, sealed)
    return cid


async def notify(pool, who: str = "ops@example.com") -> None:
    """One notification (a run that needs help), as an effect writes it in its transaction."""
    summary = {"kind": needs_help.KIND, "run_id": str(uuid.uuid4()), "seq": 3, "tool": "t"}
    summary["detail"] = "held"
    async with pool.acquire() as conn, conn.transaction():
        await outbox.insert(conn, outbox.Notification("ws", needs_help.KIND, "mail", who, summary))


def verified(seen: Seen) -> dict:
    """The payload, verified as a receiver verifies it (the library's own verifier)."""
    return Webhook(SECRET).verify(seen.body, dict(seen.headers))


async def test_a_workspace_sends_through_slack_smtp_and_a_signed_webhook(pool, config, db_url):
    server = await start(config)
    key = await auth.workspace_key(db_url, "ws", role="admin")
    grpc_channel = auth.channel(f"127.0.0.1:{server.port}", key)
    stub = channel_pb2_grpc.ChannelServiceStub(grpc_channel)
    try:
        with smtp_server() as (smtp, inbox):
            async with serving(lambda seen: reply(200, {"ok": True})) as receiver:
                await stub.AddChannel(
                    channel_pb2.AddChannelRequest(
                        name="team-slack",
                        slack=channel_pb2.SlackChannel(
                            api_url=f"{config.notify_url}/slack/api", bot_token=BOT_TOKEN
                        ),
                    )
                )
                await stub.AddChannel(
                    channel_pb2.AddChannelRequest(
                        name="mail",
                        email=channel_pb2.EmailChannel(
                            host="127.0.0.1",
                            port=smtp.port,
                            sender="agentrun@example.com",
                            tls="none",
                        ),
                    )
                )
                added = await stub.AddChannel(
                    channel_pb2.AddChannelRequest(
                        name="hooks", webhook=channel_pb2.WebhookChannel(url=f"{receiver.url}/in")
                    )
                )
                secret = added.webhook_secret
                assert secret.startswith("whsec_")
                listed = await stub.ListChannels(channel_pb2.ListChannelsRequest())
                assert [(c.name, c.kind) for c in listed.channels] == [
                    ("hooks", "webhook"),
                    ("mail", "email"),
                    ("team-slack", "slack"),
                ]
                assert BOT_TOKEN not in str(listed) and secret not in str(listed)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.AddChannel(
                        channel_pb2.AddChannelRequest(
                            name="bad", webhook=channel_pb2.WebhookChannel(url="ftp://x")
                        )
                    )
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "webhook.url" in info.value.details()

                _, approval_id = await hold(pool)
                cfg = relay.RelayConfig(
                    config.notify_url, config.public_url, envelope=local_envelope(pool)
                )
                async with httpx.AsyncClient() as client:
                    # 2 mails, 1 chat post, and each of them to the webhook.
                    assert await relay.relay_once(pool, client, cfg) == 6
                await eventually(lambda: len(inbox.messages) == 2)
    finally:
        await grpc_channel.close()
        await server.stop(grace=0)

    posts = [
        r for r in sandbox_requests(config.notify_url) if r["path"] == "/slack/api/chat.postMessage"
    ]
    mine = [p for p in posts if str(approval_id) in json.dumps(p["body"])]
    assert len(mine) == 1 and mine[0]["body"]["channel"] == "#approvals"
    buttons = mine[0]["body"]["blocks"][1]["elements"]
    assert [b["action_id"] for b in buttons] == ["approve", "reject"]
    receipt = await pool.fetchval("SELECT receipt FROM outbox WHERE channel = 'chat'")
    assert json.loads(receipt)["channel"] == "#approvals"

    assert sorted(rcpt[0] for rcpt, _ in inbox.messages) == ["alice@example.com", "bob@example.com"]
    ids = {m["Message-ID"] for _, m in inbox.messages}
    rows = await pool.fetch("SELECT notification_id FROM outbox WHERE channel = 'mail'")
    assert ids == {f"<{r['notification_id']}@agentrun>" for r in rows}

    hooks = receiver.of("/in")
    assert len(hooks) == 3
    for seen in hooks:
        data = Webhook(secret).verify(seen.body, dict(seen.headers))
        assert data["type"] == "agentrun.approval_request"
        assert data["data"]["approval_id"] == str(approval_id)
    assert {json.loads(s.body)["data"]["recipient"] for s in hooks} == {
        "alice@example.com",
        "bob@example.com",
        "#approvals",
    }


async def test_a_receiver_answering_500_three_times_gets_it_on_the_fourth_try_with_one_id(pool):
    envelope = local_envelope(pool)
    answers = [reply(500), reply(500), reply(500), reply(204, None, content=b"")]
    async with serving(lambda seen: answers.pop(0)) as receiver:
        await add_webhook(pool, envelope, f"{receiver.url}/in")
        await notify(pool)
        cfg = relay.RelayConfig("http://127.0.0.1:9", "http://approvals.test", envelope=envelope)
        async with httpx.AsyncClient() as client:
            for _ in range(4):
                # Due again now (the backoff moved it out; tests move row times, not clocks).
                await pool.execute(
                    "UPDATE outbox SET next_attempt_at = now() WHERE channel = 'webhook'"
                )
                rows = await outbox.claim(pool, 10, 1.0)
                for row in (r for r in rows if r["channel"] == "webhook"):
                    await relay.deliver(pool, client, cfg, row)
    seen = receiver.of("/in")
    assert len(seen) == 4
    assert len({s.headers["webhook-id"] for s in seen}) == 1
    assert all(verified(s)["type"] == "agentrun.run_needs_help" for s in seen)
    row = await pool.fetchrow("SELECT * FROM outbox WHERE channel = 'webhook'")
    assert row["attempts"] == 4 and row["delivered_at"] is not None
    assert f"msg_{row['notification_id'].hex}" == seen[0].headers["webhook-id"]


async def test_kill_9_between_the_send_and_the_mark_delivers_once_never_zero(
    db_url, control_plane, pool
):
    envelope = local_envelope(pool)
    async with serving(lambda seen: reply(200, {"ok": True})) as receiver:
        await add_webhook(pool, envelope, f"{receiver.url}/in")
        cp = await asyncio.to_thread(
            control_plane, db_url, AGENTRUN_FAULTS="control_plane.relay.after_send=kill"
        )
        await notify(pool)  # the park's transaction: the rows exist before any send
        await eventually(lambda: not cp.process.alive, timeout=30)
        # Killed after a send, before its mark: that row is still to be delivered.
        assert await pool.fetchval("SELECT count(*) FROM outbox WHERE delivered_at IS NULL") > 0
        await asyncio.to_thread(cp.restart, AGENTRUN_FAULTS="")

        async def all_delivered() -> bool:
            left = await pool.fetchval("SELECT count(*) FROM outbox WHERE delivered_at IS NULL")
            return left == 0 and len(receiver.of("/in")) >= 1

        await eventually(all_delivered, timeout=30)
    ids = {s.headers["webhook-id"] for s in receiver.of("/in")}
    assert len(ids) == 1  # however many posts: one notification, one id for the receiver
    cp.kill()


async def test_the_cli_adds_lists_and_removes_channels_and_never_takes_a_secret_as_an_argument(
    pool, config, db_url, monkeypatch
):
    server = await start(config)
    key = await auth.workspace_key(db_url, "ws", role="admin")
    monkeypatch.setenv("TEAM_SLACK_TOKEN", BOT_TOKEN)

    async def cli(*args: str):
        return await agentrun_async(f"127.0.0.1:{server.port}", key, *args, workspace="ws")

    try:
        slack = await cli(
            "channels", "add", "slack", "team", "--secret-env", "TEAM_SLACK_TOKEN",
            "--api-url", f"{config.notify_url}/slack/api",
        )  # fmt: skip
        assert slack.returncode == 0, slack.stderr
        hook = await cli("channels", "add", "webhook", "hooks", "--url", "https://example.com/in")
        assert hook.returncode == 0 and "signing secret (shown once" in hook.stderr
        listed = await cli("channels", "list", "--json")
        names = [(c["name"], c["kind"]) for c in json.loads(listed.stdout)]
        assert names == [("hooks", "webhook"), ("team", "slack")]
        assert BOT_TOKEN not in listed.stdout
        again = await cli("channels", "add", "webhook", "hooks", "--url", "https://x.example")
        assert again.returncode != 0 and "exists" in again.stderr
        bad = await cli(
            "channels",
            "add",
            "webhook",
            "ends",
            "--url",
            "https://x.example",
            "--event",
            "run.done",
        )
        assert bad.returncode != 0 and "webhook.events[0]" in bad.stderr
        ends = await cli(
            "channels", "add", "webhook", "ends", "--url", "https://x.example",
            "--event", "run.failed", "--agent", "mailer",
        )  # fmt: skip
        assert ends.returncode == 0, ends.stderr
        assert (await cli("channels", "remove", "ends")).returncode == 0
        assert (await cli("channels", "remove", "hooks")).returncode == 0
        listed = await cli("channels", "list", "--json")
        assert [c["name"] for c in json.loads(listed.stdout)] == ["team"]
    finally:
        await server.stop(grace=0)


async def add_slack(pool, envelope, notify_url: str) -> uuid.UUID:
    await factories.agent_version(pool, "ws", "setup")  # the workspace
    cid = uuid.uuid4()
    sealed = await secrets.seal(envelope, "ws", cid, BOT_TOKEN)
    config = {"api_url": f"{notify_url}/slack/api"}
    await channels.insert(pool, "ws", cid, "slack", "team", config, sealed)
    return cid


async def test_cancelling_a_run_at_an_approval_edits_its_slack_message(pool, config):
    envelope = local_envelope(pool)
    await add_slack(pool, envelope, config.notify_url)
    run_id, approval_id = await hold(pool)
    cfg = relay.RelayConfig(config.notify_url, config.public_url, envelope=envelope)
    async with httpx.AsyncClient() as client:
        await relay.relay_once(pool, client, cfg)
        receipt = json.loads(
            await pool.fetchval("SELECT receipt FROM outbox WHERE channel = 'chat'")
        )
        await runs.cancel_run(pool, "ws", run_id, "wrong customer")
        # A run cancelled before its request went out: the request is never posted.
        late_run, late_approval = await hold(pool)
        await runs.cancel_run(pool, "ws", late_run, "duplicate")

        async def relayed_all() -> bool:
            # An edit waits for its message to be sent (a retry, due again now).
            await pool.execute("UPDATE outbox SET next_attempt_at = now()")
            await relay.relay_once(pool, client, cfg)
            return not await pool.fetchval("SELECT count(*) FROM outbox WHERE delivered_at IS NULL")

        await eventually(relayed_all, timeout=10)
    calls = [r for r in sandbox_requests(config.notify_url) if r["path"].startswith("/slack/api/")]
    posted = [c for c in calls if str(late_approval) in json.dumps(c["body"])]
    assert [c["path"] for c in posted] == []  # nothing about the late one reached Slack
    updates = [c for c in calls if c["path"] == "/slack/api/chat.update"]
    mine = [u for u in updates if u["body"]["ts"] == receipt["ts"]]
    assert len(mine) == 1
    body = mine[0]["body"]
    assert body["channel"] == receipt["channel"]
    assert "Closed" in body["text"] and "run cancelled: wrong customer" in body["text"]
    assert [b["type"] for b in body["blocks"]] == ["section"]  # the buttons are gone
    closed = await pool.fetch("SELECT payload, receipt FROM outbox WHERE kind = 'approval_closed'")
    edits = {json.loads(r["payload"])["approval_id"]: json.loads(r["receipt"]) for r in closed}
    assert edits == {str(approval_id): {"edited": 1}, str(late_approval): {"edited": 0}}


async def test_a_webhook_subscribed_to_run_failures_gets_each_once_signed(pool):
    envelope = local_envelope(pool)
    async with serving(lambda seen: reply(200, {"ok": True})) as receiver:
        cid = await add_webhook(pool, envelope, f"{receiver.url}/in")
        config = {"url": f"{receiver.url}/in", "events": ["run.failed"], "agent_id": "mailer"}
        await pool.execute(
            "UPDATE channels SET config = $2::jsonb, created_at = now() - interval '1 minute'"
            " WHERE channel_id = $1",
            cid,
            json.dumps(config),
        )
        failed, _ = await hold(pool)  # agent mailer
        done, _ = await hold(pool)
        other, _ = await hold(pool, agent="other")
        for run_id, status in ((failed, "failed"), (done, "completed"), (other, "failed")):
            await pool.execute(
                "UPDATE runs SET status = $2, wait_reason = NULL, finished_at = now(),"
                " error = CASE WHEN $2 = 'failed' THEN 'broke' END WHERE run_id = $1",
                run_id,
                status,
            )
        assert await lifecycle.enqueue_once(pool) == 1
        assert await lifecycle.enqueue_once(pool) == 0  # the window read again: nothing twice
        cfg = relay.RelayConfig("http://127.0.0.1:9", "http://approvals.test", envelope=envelope)
        await pool.execute("UPDATE outbox SET delivered_at = now() WHERE kind <> 'run_failed'")
        async with httpx.AsyncClient() as client:
            assert await relay.relay_once(pool, client, cfg) == 1
    [seen] = receiver.of("/in")
    data = verified(seen)
    assert data["type"] == "agentrun.run_failed"
    assert (data["data"]["run_id"], data["data"]["error"]) == (str(failed), "broke")
