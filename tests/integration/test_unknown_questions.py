"""An unknown outcome asks a person (issue 43): the question and its notifications in the
park's transaction, the Slack button answers once, the policy on the database clock."""

from __future__ import annotations

import json
from datetime import timedelta

import httpx

from control_plane.approvals import relay, unknown_outcome
from control_plane.store import lease, questions, runs, steps
from tests import factories
from tests.harness.agentrun_api import sandbox_requests
from tests.harness.approval_routes import (  # noqa: F401 (fixtures)
    config_fixture,
    http_fixture,
    pool_fixture,
)
from tests.harness.commits import pipeline
from tests.integration.test_approvals import slack_request

ARGS = {"channel": "#general", "text": "shipped"}
POLICY = {
    "approval": {"approvers": ["alice@example.com"], "slack_approvers": ["U_ALICE"]},
    "unknown_outcome": {
        "ask": ["approvers", "starter", "oncall@example.com"],
        "every_seconds": 600,
        "on_timeout": "escalate",
        "escalate_to": ["carol@example.com"],
        "max_reminders": 1,
    },
}


async def park_unknown(pool, policy=None):
    """A run parked on an unknown chat post, committed as the executor commits it."""
    await factories.agent_version(
        pool, "ws", "poster", {**factories.DEFAULT_SPEC, **(policy or POLICY)}
    )
    adm = runs.Admission(
        "ws", "poster", 1, "go", None, 50, 100_000, 100, 3600, started_by="person:dan@example.com"
    )
    run = await runs.insert_run(pool, adm)
    held = [r for r in await lease.claim_due(pool, ["ex"], 30) if r.run_id == run.run_id][0]
    key = f"{run.run_id}:2"
    decision = {
        "content": None,
        "tool_calls": [{"id": "c1", "name": "post_chat", "arguments": ARGS}],
    }
    started = {
        "call_id": "c1",
        "tool": "post_chat",
        "arguments": ARGS,
        "idempotency_key": key,
        "class": "none",
    }
    result = {
        "call_id": "c1",
        "tool": "post_chat",
        "status": "unknown",
        "output": None,
        "error": "connection reset after the request was sent",
        "awaiting": "human",
    }
    # The call is committed as started before it leaves; its unknown result and the park after.
    sent = steps.CommitRequest(
        "ws",
        run.run_id,
        held.lease_epoch,
        [
            steps.NewStep(1, "model_decision", None, json.dumps(decision)),
            steps.NewStep(2, "tool_started", 1, json.dumps(started)),
        ],
        steps.Transition(),
    )
    await pipeline(pool).commit(sent, 30)
    req = steps.CommitRequest(
        "ws",
        run.run_id,
        held.lease_epoch,
        [
            steps.NewStep(3, "tool_result", 2, json.dumps(result)),
            steps.NewStep(4, "park", None, json.dumps({"wait_reason": "human"})),
        ],
        steps.Transition(status="waiting", wait_reason="human"),
    )
    await pipeline(pool).commit(req, 30)
    return run.run_id, req


def slack_click(user: str, run_id, action: str) -> bytes:
    payload = {
        "type": "block_actions",
        "user": {"id": user},
        "actions": [{"action_id": action, "value": f"ws:{run_id}:3"}],
    }
    return str(httpx.QueryParams({"payload": json.dumps(payload)})).encode()


async def test_the_park_asks_in_its_transaction_and_the_slack_button_answers_once(
    pool, config, http
):
    run_id, req = await park_unknown(pool)
    # Written by the park's commit itself: the question and one notification per person.
    q = await questions.get(pool, "ws", run_id, 3)
    assert q is not None and q.closed_at is None
    assert q.recipients == ["alice@example.com", "dan@example.com", "oncall@example.com"]
    rows = await pool.fetch("SELECT channel, recipient FROM outbox WHERE kind = 'unknown_outcome'")
    assert sorted(tuple(r) for r in rows) == [
        ("chat", "#approvals"),
        ("mail", "alice@example.com"),
        ("mail", "dan@example.com"),
        ("mail", "oncall@example.com"),
    ]
    # The commit resent after it landed asks nobody twice.
    await pipeline(pool).commit(req, 30)
    assert await pool.fetchval("SELECT count(*) FROM outbox") == 4

    async with httpx.AsyncClient() as client:
        cfg = relay.RelayConfig(config.notify_url, config.public_url)
        assert await relay.relay_once(pool, client, cfg) == 4
    sent = [r for r in sandbox_requests(config.notify_url) if str(run_id) in json.dumps(r["body"])]
    mail = next(
        r["body"]
        for r in sent
        if r["path"] == "/mail/send" and r["body"]["to"] == "dan@example.com"
    )
    for what in (
        f"{run_id}:2",
        "class none",
        '"text": "shipped"',
        "connection reset",
        "runs resolve",
    ):
        assert what in mail["body"], what
    chat = next(r["body"] for r in sent if r["path"] == "/chat/messages")
    assert [a["action_id"] for a in chat["actions"]] == list(unknown_outcome.ANSWERS)

    # Only a Slack user the question names answers; the first answer wins, once.
    stranger = slack_click("U_MALLORY", run_id, "happened")
    refused = await http.post(
        "/slack/interactions", content=stranger, headers=slack_request(stranger)
    )
    assert refused.status_code == 403
    click = slack_click("U_ALICE", run_id, "happened")
    first = await http.post("/slack/interactions", content=click, headers=slack_request(click))
    assert first.status_code == 200, first.text
    assert first.json()["decided_by"] == "slack:U_ALICE"
    again = slack_click("U_ALICE", run_id, "retry")
    second = await http.post("/slack/interactions", content=again, headers=slack_request(again))
    assert second.status_code == 409
    assert "already decided by slack:U_ALICE: happened" in second.json()["error"]
    answer = await pool.fetchrow(
        "SELECT payload FROM steps WHERE run_id = $1 AND kind = 'tool_result' AND ref_seq = 3",
        run_id,
    )
    assert json.loads(answer["payload"])["decided_by"] == "slack:U_ALICE"
    q = await questions.get(pool, "ws", run_id, 3)
    assert q.closed_reason == "answered happened by slack:U_ALICE"
    actor = await pool.fetchval(
        "SELECT actor FROM audit_log WHERE action = 'unknown_outcome.resolved'"
    )
    assert actor == "slack:U_ALICE"


async def test_escalation_reminder_and_failure_follow_the_database_clock(pool):
    run_id, _ = await park_unknown(pool)
    asked = await pool.fetchval(
        "SELECT created_at FROM unknown_questions WHERE run_id = $1", run_id
    )
    early = asked + timedelta(seconds=599)
    assert await unknown_outcome.expire_once(pool, early) == []
    # First period: escalate to carol; the second: remind her; the third: the run fails.
    assert await unknown_outcome.expire_once(pool, asked + timedelta(seconds=601)) == ["escalate"]
    escalated = await pool.fetch(
        "SELECT recipient FROM outbox WHERE kind = 'unknown_outcome_escalation'"
    )
    assert {r["recipient"] for r in escalated} == {"carol@example.com", "#approvals"}
    assert await unknown_outcome.expire_once(pool, asked + timedelta(seconds=1202)) == ["remind"]
    assert (
        await pool.fetchval("SELECT count(*) FROM outbox WHERE kind = 'unknown_outcome_reminder'")
        == 2
    )
    assert await unknown_outcome.expire_once(pool, asked + timedelta(seconds=1803)) == ["fail"]
    run = await runs.get_run(pool, "ws", run_id)
    assert (run.status, run.error) == (
        "failed",
        "nobody answered the unknown outcome of post_chat (step 3)",
    )
    q = await questions.get(pool, "ws", run_id, 3)
    assert q.closed_reason.startswith("run failed: nobody answered")


async def test_cancelling_the_run_closes_its_question(pool):
    run_id, _ = await park_unknown(pool)
    await runs.cancel_run(pool, "ws", run_id, "not needed")
    q = await questions.get(pool, "ws", run_id, 3)
    assert q.closed_reason == "run cancelled: not needed"
    assert await unknown_outcome.expire_once(pool, q.next_at + timedelta(days=1)) == []
