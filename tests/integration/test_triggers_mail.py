"""Inbound mail and push sources against a real control plane, Postgres and a mailbox server."""

from __future__ import annotations

import asyncio
import base64
import json

import asyncpg
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from agentrun.v1 import trigger_pb2
from control_plane.ground.config import RunDefaults
from control_plane.store import triggers as store
from control_plane.triggers import admission, mail, push
from sandbox.providers import create_app
from sandbox.providers.mailbox import MailboxProvider
from sandbox.serve import BackgroundServer
from tests.harness.triggers import TriggerApi, count, post, signed
from tests.harness.waiting import eventually

WS = "ws"
INBOX = "inbox@acme.test"


@pytest.fixture
async def api(server, db_url):
    client = await TriggerApi.connect(f"127.0.0.1:{server.port}", db_url, WS)
    for agent in ("triage", "alice", "bob"):
        await client.publish(agent)
    yield client
    await client.close()


@pytest.fixture
async def http(server):
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}", timeout=10) as c:
        yield c


@pytest.fixture
def mailbox():
    with BackgroundServer(create_app([MailboxProvider()])) as running:
        yield running


def message(n: int, **overrides) -> dict:
    return {
        "message_id": f"<m{n}@mail.test>",
        "from": f"Sender {n} <sender{n}@example.com>",
        "to": [INBOX],
        "subject": f"Message {n}",
        "text": f"body {n}",
        "headers": {},
        **overrides,
    }


async def mail_trigger(api, trigger_id, agent, **source) -> str:
    _, secret = await api.create(trigger_id, agent, mail=trigger_pb2.MailSource(**source))
    return secret


async def deliver(http, trigger_id, secret, msg) -> httpx.Response:
    body, headers = signed("hmac_sha256", secret, msg, "")
    return await post(http, WS, trigger_id, body, headers)


async def test_each_message_delivered_three_times_starts_one_run(api, http, db):
    secret = await mail_trigger(api, "inbox", "triage", address=INBOX)
    for n in range(3):
        sequential = [await deliver(http, "inbox", secret, message(n)) for _ in range(3)]
        concurrent = await asyncio.gather(
            *(deliver(http, "inbox", secret, message(n)) for _ in range(3))
        )
        answers = [*sequential, *concurrent]
        assert {r.status_code for r in answers} == {202}
        assert len({r.content for r in answers}) == 1
    events = await api.events("inbox")
    assert sorted(e.dedupe_key for e in events) == [
        "<m0@mail.test>",
        "<m1@mail.test>",
        "<m2@mail.test>",
    ]
    assert await count(db, "runs") == 3
    assert (await deliver(http, "inbox", secret, {"from": "x@y.z"})).status_code == 400


async def test_mail_from_known_senders_is_filtered_before_a_run(api, http, db):
    in_crm = trigger_pb2.FilterRule(
        field="from_address",
        op=trigger_pb2.FILTER_OP_NOT_IN,
        values=["sender1@example.com", "sender2@example.com"],
    )
    _, secret = await api.create("leads", "triage", mail=trigger_pb2.MailSource(), filters=[in_crm])
    known = (await deliver(http, "leads", secret, message(1))).json()
    new = (await deliver(http, "leads", secret, message(3))).json()
    assert known["status"] == "filtered" and "from_address not_in" in known["reason"]
    assert new["status"] == "accepted"
    assert await count(db, "runs") == 1


async def run_depth(db, run_id: str) -> int:
    payload = await db.fetchval(
        "SELECT payload FROM steps WHERE run_id = $1::uuid AND seq = 0", run_id
    )
    return json.loads(payload)["trigger"]["chain_depth"]


async def test_an_agent_to_agent_mail_loop_stops_at_the_configured_depth(api, http, db):
    secrets = {
        "alice": await mail_trigger(api, "alice-inbox", "alice", max_chain_depth=2),
        "bob": await mail_trigger(api, "bob-inbox", "bob", max_chain_depth=2),
    }
    peer = {"alice": "bob", "bob": "alice"}
    # A human writes to alice; from then on each run replies to the other agent, and the
    # reply carries the marker headers mail sent by that run must carry (mail.outbound_headers).
    to, msg, hops = "alice", message(0, subject="ping"), []
    for hop in range(10):
        reply = (await deliver(http, f"{to}-inbox", secrets[to], msg)).json()
        hops.append((to, reply["status"]))
        if reply["status"] != "accepted":
            break
        depth = await run_depth(db, reply["run_id"])
        msg = message(hop + 1, subject="Re: ping", headers=mail.outbound_headers(depth))
        to = peer[to]
    assert hops == [
        ("alice", "accepted"),
        ("bob", "accepted"),
        ("alice", "accepted"),
        ("bob", "filtered"),
    ]
    assert reply["reason"] == "agent-to-agent loop stopped: chain depth 3 exceeds 2"
    depths = sorted(
        [await run_depth(db, str(r["run_id"])) for r in await db.fetch("SELECT run_id FROM runs")]
    )
    assert depths == [0, 1, 2]


# --- push sources -----------------------------------------------------------------------------


async def fill(mailbox, n: int, first: int = 1) -> None:
    async with httpx.AsyncClient(base_url=mailbox.url) as client:
        for i in range(first, first + n):
            resp = await client.post(f"/mailbox/{INBOX}/messages", json=message(i))
            resp.raise_for_status()


async def push_trigger(api, mailbox, trigger_id="gmail") -> str:
    source = trigger_pb2.MailPushSource(history_url=f"{mailbox.url}/mailbox/{INBOX}/history")
    _, secret = await api.create(trigger_id, "triage", mail_push=source)
    return secret


def pubsub(history_id: int) -> dict:
    data = json.dumps({"emailAddress": INBOX, "historyId": history_id}).encode()
    return {
        "message": {"data": base64.b64encode(data).decode(), "messageId": "2070443601311540"},
        "subscription": "projects/p/subscriptions/s",
    }


async def test_a_replayed_push_notification_starts_one_run_per_message(api, http, db, mailbox):
    secret = await push_trigger(api, mailbox)
    await fill(mailbox, 5)
    replies = []
    for _ in range(3):
        body, headers = signed("hmac_sha256", secret, pubsub(5), "")
        replies.append(await post(http, WS, "gmail", body, headers))
    assert {r.status_code for r in replies} == {202} and len({r.content for r in replies}) == 1

    async def fetched(n: int, cursor: int):
        events = await count(db, "trigger_events")
        last = await db.fetchval("SELECT last_history_id FROM triggers")
        return events == n and last == cursor

    await eventually(lambda: fetched(5, 5), message="five messages fetched, cursor at 5")
    await fill(mailbox, 2, first=6)
    body, headers = signed("hmac_sha256", secret, pubsub(7), "")
    await asyncio.gather(*(post(http, WS, "gmail", body, headers) for _ in range(3)))
    await eventually(lambda: fetched(7, 7), message="two more fetched, cursor at 7")
    assert await count(db, "runs") == 7
    assert await db.fetchval("SELECT count(DISTINCT dedupe_key) FROM trigger_events") == 7


@pytest.fixture
async def pools(db_url):
    made = [await asyncpg.create_pool(db_url, min_size=1, max_size=4) for _ in range(2)]
    yield made
    for pool in made:
        await pool.close()


def fetcher(pool) -> push.PushFetcher:
    return push.PushFetcher(pool, RunDefaults(), lambda: None)


async def test_two_overlapping_fetches_start_each_message_once(api, db, mailbox, pools):
    await push_trigger(api, mailbox)
    await fill(mailbox, 5)
    # Fetched directly (never announced, so this replica's own fetcher stays out of it).
    row = await store.get_trigger(pools[0], WS, "gmail")
    results = await asyncio.gather(fetcher(pools[0]).fetch(row), fetcher(pools[1]).fetch(row))
    assert [r.messages for r in results] == [5, 5]
    assert sum(r.runs_started for r in results) == 5
    assert await count(db, "runs") == 5 and await count(db, "trigger_events") == 5
    after = await store.get_trigger(pools[0], WS, "gmail")
    assert (after["last_history_id"], after["fetch_due_at"]) == (5, None)
    # A late replay of an old notification queues nothing.
    await store.announce(pools[0], WS, "gmail", 3)
    assert (await store.get_trigger(pools[0], WS, "gmail"))["fetch_due_at"] is None


async def test_the_cursor_moves_only_after_the_fetched_events_commit(
    api, db, mailbox, pools, monkeypatch
):
    await push_trigger(api, mailbox)
    await fill(mailbox, 5)
    row = await store.get_trigger(pools[0], WS, "gmail")
    real_admit, calls = admission.admit, []

    async def crash_on_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise ConnectionError("control plane lost the database mid-fetch")
        return await real_admit(*args, **kwargs)

    monkeypatch.setattr(push.admission, "admit", crash_on_third)
    with pytest.raises(ConnectionError):
        await fetcher(pools[0]).fetch(row)
    assert await count(db, "trigger_events") == 2
    assert await db.fetchval("SELECT last_history_id FROM triggers") == 0  # not advanced
    monkeypatch.setattr(push.admission, "admit", real_admit)
    result = await fetcher(pools[0]).fetch(row)  # the retry refetches everything since 0
    assert (result.messages, result.runs_started, result.history_id) == (5, 3, 5)
    assert await count(db, "runs") == 5
    assert await db.fetchval("SELECT last_history_id FROM triggers") == 5


# --- the loop end to end: real executors send the replies --------------------------------------


@pytest.mark.parametrize("network", ["headers untouched", "as from another installation"])
async def test_a_real_agent_to_agent_mail_loop_stops_at_the_configured_depth(
    db_url, control_plane, executor_factory, sandbox_providers, db, network
):
    """Two agents answer every email with an email; a test 'mail network' delivers each sent
    message to the other agent's inbox. Every send carries our chain marker and depth
    (executor/tools/chain.py), and the chain stops at max_chain_depth. Delivered "as from
    another installation", the mail loses the key stamp that names its sending run in this
    database: the marker, read from the message alone, stops the loop just the same."""
    sandbox_providers.reset()
    cp = control_plane(db_url)
    api = await TriggerApi.connect(cp.address, db_url, WS)
    secrets = {}
    for agent in ("alice", "bob"):
        await api.publish(agent, model="mail_reply", tools=("send_email",))
        secrets[agent] = await mail_trigger(api, f"{agent}-inbox", agent, max_chain_depth=2)
    executor_factory(cp)
    peer = {"alice": "bob", "bob": "alice"}
    async with httpx.AsyncClient(base_url=cp.http_url, timeout=10) as http:
        first = await deliver(http, "alice-inbox", secrets["alice"], message(0, subject="ping"))
        assert first.json()["status"] == "accepted"
        delivered: set[str] = set()

        async def carry_mail() -> bool:
            """Deliver what was sent since last time; true once an inbox stopped the loop."""
            listing = await http.get(f"{sandbox_providers.url}/mail/sent")
            for sent in listing.json()["messages"]:
                if sent["message_id"] in delivered:
                    continue
                sender_run = sent["headers"]["X-Agentrun-Key"].rsplit(":", 1)[0]
                sender = await db.fetchval(
                    "SELECT agent_id FROM runs WHERE run_id = $1::uuid", sender_run
                )
                headers = dict(sent["headers"])
                assert headers["X-Agentrun-Origin"] == "agentrun"
                if network != "headers untouched":
                    del headers["X-Agentrun-Key"]
                inbound = {
                    "message_id": sent["message_id"],
                    "from": sent["from"],
                    "to": [sent["to"]],
                    "subject": sent["subject"],
                    "text": sent["body"],
                    "headers": headers,
                }
                to = peer[sender]
                assert (await deliver(http, f"{to}-inbox", secrets[to], inbound)).status_code == 202
                delivered.add(sent["message_id"])
            return await count(db, "trigger_events", status="filtered") == 1

        await eventually(carry_mail, timeout=90, interval=0.2, message="the loop stopped")
    rows = await db.fetch(
        "SELECT trigger_id, status, chain_depth, reason FROM trigger_events ORDER BY received_at"
    )
    assert [(r["trigger_id"], r["status"], r["chain_depth"]) for r in rows] == [
        ("alice-inbox", "accepted", 0),
        ("bob-inbox", "accepted", 1),
        ("alice-inbox", "accepted", 2),
        ("bob-inbox", "filtered", 3),
    ]
    assert rows[-1]["reason"] == "agent-to-agent loop stopped: chain depth 3 exceeds 2"
    assert await count(db, "runs", workspace_id=WS) == 3 and len(delivered) == 3
    await api.close()


@pytest.fixture
def garbled_history():
    """A history API answering every listing with a page of the wrong shape ("history" a
    number, "historyId" past any integer)."""

    async def listing(_request: Request) -> Response:
        return Response(b'{"historyId": 1e999, "history": 7}', media_type="application/json")

    app = Starlette(routes=[Route("/history", listing)])
    with BackgroundServer(app) as running:
        yield running


async def test_a_source_answering_garbage_fails_alone_and_the_others_are_fetched(
    api, db, mailbox, pools, garbled_history
):
    """One workspace's source cannot hold up another's: its fetch fails with a FetchError
    (before: a TypeError, then an OverflowError, out of the whole round, leaving the
    round's other sources leased and unfetched, round after round)."""
    await push_trigger(api, mailbox)
    source = trigger_pb2.MailPushSource(history_url=f"{garbled_history.url}/history")
    await api.create("garbled", "triage", mail_push=source)
    await fill(mailbox, 2)
    bad = await store.get_trigger(pools[0], WS, "garbled")
    with pytest.raises(push.FetchError):
        await fetcher(pools[0]).fetch(bad)
    # Both due, the garbled one first: a round fetches the other all the same.
    await store.announce(pools[0], WS, "garbled", 1)
    await store.announce(pools[0], WS, "gmail", 2)
    await fetcher(pools[0]).fetch_due()  # this replica's own fetcher may take some too

    async def both_runs() -> bool:
        return await count(db, "runs") == 2

    await eventually(both_runs, timeout=10, message="the good source's messages were not fetched")
    cursors = dict(await db.fetch("SELECT trigger_id, last_history_id FROM triggers"))
    assert cursors == {"gmail": 2, "garbled": 0}


async def test_a_message_postgres_cannot_store_is_skipped_and_the_cursor_moves_past_it(
    api, db, mailbox, pools
):
    """A message whose subject holds a NUL is refused naming the field and skipped; the
    others start their runs and the cursor moves on (before, every fetch failed on it and
    the source never got past it)."""
    await push_trigger(api, mailbox)
    await fill(mailbox, 1)
    async with httpx.AsyncClient(base_url=mailbox.url) as client:
        odd = message(2, subject="Re: a\x00b")
        (await client.post(f"/mailbox/{INBOX}/messages", json=odd)).raise_for_status()
    await fill(mailbox, 1, first=3)
    row = await store.get_trigger(pools[0], WS, "gmail")
    result = await fetcher(pools[0]).fetch(row)
    assert (result.messages, result.runs_started, result.history_id) == (3, 2, 3)
    assert await count(db, "runs") == 2
    assert await db.fetchval("SELECT last_history_id FROM triggers") == 3
