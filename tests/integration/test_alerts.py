"""Alert rules (issue 43): a breach fires once through a signed webhook channel, not again
while it lasts, and again after it resolved and breached anew."""

from __future__ import annotations

import json

import grpc
import httpx
import pytest

from agentrun.v1 import channel_pb2, channel_pb2_grpc
from control_plane.approvals import relay
from control_plane.channels import alerts
from control_plane.server import start
from control_plane.store import runs
from tests import factories
from tests.harness import auth
from tests.harness.approval_routes import (  # noqa: F401 (fixtures)
    config_fixture,
    pool_fixture,
)
from tests.harness.cli import agentrun_async
from tests.harness.http_stub import reply, serving
from tests.integration.test_approvals import hold
from tests.integration.test_channels import add_webhook, local_envelope, verified


async def finish(pool, failed: int, completed: int, agent: str = "mailer") -> None:
    """Runs of `agent` that finished just now, `failed` of them failed."""
    await factories.agent_version(pool, "ws", agent)
    for i in range(failed + completed):
        adm = runs.Admission("ws", agent, 1, "go", None, 50, 100_000, 100, 3600)
        run = await runs.insert_run(pool, adm)
        status = "failed" if i < failed else "completed"
        await pool.execute(
            "UPDATE runs SET status = $2, finished_at = now(),"
            " error = CASE WHEN $2 = 'failed' THEN 'broke' END WHERE run_id = $1",
            run.run_id,
            status,
        )


async def deliver(pool, envelope) -> int:
    cfg = relay.RelayConfig("http://127.0.0.1:9", "http://approvals.test", envelope=envelope)
    await pool.execute("UPDATE outbox SET delivered_at = now() WHERE kind <> $1", alerts.KIND)
    async with httpx.AsyncClient() as client:
        return await relay.relay_once(pool, client, cfg)


async def test_a_failure_rate_rule_fires_once_per_breach_through_a_signed_webhook(
    pool, config, db_url
):
    envelope = local_envelope(pool)
    server = await start(config)
    key = await auth.workspace_key(db_url, "ws", role="admin")
    try:
        async with serving(lambda seen: reply(200, {"ok": True})) as receiver:
            await add_webhook(pool, envelope, f"{receiver.url}/in", name="ops")
            added = await agentrun_async(
                f"127.0.0.1:{server.port}", key, "alerts", "add", "failing", "--channel", "ops",
                "--agent", "mailer", "--failure-rate", "0.2", "--min-finished", "10",
                "--window", "15m", workspace="ws",
            )  # fmt: skip
            assert added.returncode == 0, added.stderr
            await finish(pool, failed=2, completed=7)
            assert await alerts.evaluate_once(pool) == 0  # nine finished: too few to judge
            await finish(pool, failed=0, completed=1)
            assert await alerts.evaluate_once(pool) == 1  # 2 of 10 failed: 20 %
            assert await alerts.evaluate_once(pool) == 0  # still breached: not again
            assert await deliver(pool, envelope) == 1
            [first] = receiver.of("/in")
            data = verified(first)
            assert data["type"] == "agentrun.alert_fired"
            assert data["data"]["rule"] == "failing"
            assert (data["data"]["failed"], data["data"]["finished"]) == (2, 10)

            # The window moves past those runs: resolved; a new breach fires anew.
            await pool.execute("UPDATE runs SET finished_at = now() - interval '1 hour'")
            assert await alerts.evaluate_once(pool) == 0
            listed = await agentrun_async(
                f"127.0.0.1:{server.port}", key, "alerts", "list", "--json", workspace="ws"
            )
            [rule] = json.loads(listed.stdout)
            assert rule["fire_count"] == 1 and rule["resolve_time"] and rule["channel"] == "ops"
            await finish(pool, failed=3, completed=7)
            await finish(pool, failed=5, completed=0, agent="other")  # another agent's
            assert await alerts.evaluate_once(pool) == 1
            assert await alerts.evaluate_once(pool) == 0
            assert await deliver(pool, envelope) == 1
            first_again, second = receiver.of("/in")
            assert verified(second)["data"]["failed"] == 3
            assert second.headers["webhook-id"] != first.headers["webhook-id"]
    finally:
        await server.stop(grace=0)


async def test_a_run_stuck_on_a_person_fires_and_resolves_when_it_is_no_longer_waiting(pool):
    envelope = local_envelope(pool)
    async with serving(lambda seen: reply(200, {"ok": True})) as receiver:
        cid = await add_webhook(pool, envelope, f"{receiver.url}/in", name="ops")
        await pool.execute(
            "INSERT INTO alert_rules (workspace_id, name, channel_id, kind, waiting_seconds)"
            " VALUES ('ws', 'stuck', $1, 'stuck_on_person', 3600)",
            cid,
        )
        run_id, _ = await hold(pool)  # waiting on an approval
        assert await alerts.evaluate_once(pool) == 0  # not for long yet
        await pool.execute(
            "UPDATE runs SET updated_at = now() - interval '2 hours' WHERE run_id = $1", run_id
        )
        assert await alerts.evaluate_once(pool) == 1
        assert await alerts.evaluate_once(pool) == 0
        assert await deliver(pool, envelope) == 1
        [seen] = receiver.of("/in")
        assert verified(seen)["data"]["stuck"] == 1
        await pool.execute(
            "UPDATE runs SET status = 'cancelled', wait_reason = NULL, finished_at = now()"
            " WHERE run_id = $1",
            run_id,
        )
        assert await alerts.evaluate_once(pool) == 0
        resolved = await pool.fetchval("SELECT resolved_at FROM alert_rules")
        assert resolved is not None


async def test_a_bad_rule_is_refused_naming_the_field(pool, config, db_url):
    envelope = local_envelope(pool)
    await add_webhook(pool, envelope, "https://example.com/in", name="ops")
    server = await start(config)
    key = await auth.workspace_key(db_url, "ws", role="admin")
    try:
        async with auth.channel(f"127.0.0.1:{server.port}", key) as ch:
            stub = channel_pb2_grpc.ChannelServiceStub(ch)
            cases = {
                "rule.channel": channel_pb2.AlertRule(name="a", channel="nope"),
                "rule.failure_rate.threshold": channel_pb2.AlertRule(
                    name="a",
                    channel="ops",
                    failure_rate=channel_pb2.FailureRate(threshold=1.5, min_finished=10),
                ),
                "rule.failure_rate.window_seconds": channel_pb2.AlertRule(
                    name="a",
                    channel="ops",
                    failure_rate=channel_pb2.FailureRate(threshold=0.2, min_finished=10),
                ),
                "rule.condition": channel_pb2.AlertRule(name="a", channel="ops"),
            }
            for field, rule in cases.items():
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.AddAlertRule(
                        channel_pb2.AddAlertRuleRequest(workspace_id="ws", rule=rule)
                    )
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
                assert field in str(err.value.details()), (field, err.value.details())
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.RemoveAlertRule(
                    channel_pb2.RemoveAlertRuleRequest(workspace_id="ws", name="a")
                )
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        await server.stop(grace=0)
