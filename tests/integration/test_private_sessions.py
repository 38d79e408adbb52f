"""Private sessions (issue 42 item 4, docs/sessions.md): a session private to its members is
invisible to every other reader of the workspace, down to the workspace feed, over gRPC and
HTTP alike; its members and the workspace's admins see it; adding a member shows it to them.

Real keys of four principals through the real server: alice (operator) makes a private
session with bob (operator) and a public one; eve (operator) is outside until alice adds
her; the admin key sees everything. No executor: the turns' runs stay queued, which is all
that reading them needs.
"""

from __future__ import annotations

import json
import re
from typing import Any

import asyncpg
import grpc
import httpx
import pytest

from agentrun.v1 import (
    run_pb2,
    run_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
    stream_pb2,
    stream_pb2_grpc,
)
from tests.harness import auth
from tests.harness.agentrun_api import Api

WS = "ws"
PRIVATE = session_pb2.SESSION_VISIBILITY_PRIVATE


class Reader:
    """One principal's doors: gRPC stubs over its own channel, and HTTP with its key."""

    def __init__(self, cp: Any, key: str) -> None:
        self.cp, self.key = cp, key
        self.channel = auth.channel(cp.address, key)
        self.sessions = session_pb2_grpc.SessionServiceStub(self.channel)
        self.runs = run_pb2_grpc.RunServiceStub(self.channel)
        self.streams = stream_pb2_grpc.StreamServiceStub(self.channel)

    async def http(self, path: str, **params: str) -> httpx.Response:
        url = f"{self.cp.http_url}/v1/workspaces/{WS}/{path}"
        async with httpx.AsyncClient(headers=auth.bearer(self.key), timeout=30) as http:
            return await http.get(url, params=params)

    async def feed_http(self) -> tuple[list[str], str]:
        """The ids in the workspace feed from offset -1 to now (HTTP, page after page), and
        where it ends."""
        ids: list[str] = []
        offset = "-1"
        while True:
            answer = await self.http("streams/_agentrun/feed", offset=offset)
            assert answer.status_code == 200, answer.text
            ids += [e["id"] for e in answer.json()]
            offset = answer.headers["stream-next-offset"]
            if answer.headers.get("stream-up-to-date") == "true":
                return ids, offset

    async def feed_grpc(self) -> list[str]:
        """The ids in the workspace feed from offset -1 (gRPC ReadStream)."""
        request = stream_pb2.ReadStreamRequest(workspace_id=WS, path="_agentrun/feed", offset="-1")
        read = [r async for r in self.streams.ReadStream(request)]
        assert read[-1].up_to_date
        return [json.loads(r.data)[0]["id"] for r in read if r.data]

    async def session_ids(self) -> list[str]:
        page = await self.sessions.ListSessions(session_pb2.ListSessionsRequest(workspace_id=WS))
        return [s.session_id for s in page.sessions]

    async def run_ids(self) -> list[str]:
        page = await self.runs.ListRuns(run_pb2.ListRunsRequest(workspace_id=WS))
        return [r.run_id for r in page.runs]


async def not_found(call: Any) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND, refused.value.details()
    return refused.value.details() or ""


async def assert_outside(who: Reader, session_id: str, run_id: str) -> None:
    """Every door answers as if the session and its run did not exist."""
    s = session_pb2
    await not_found(
        who.sessions.GetSession(s.GetSessionRequest(workspace_id=WS, session_id=session_id))
    )
    await not_found(
        who.sessions.ListTurns(s.ListTurnsRequest(workspace_id=WS, session_id=session_id))
    )
    await not_found(
        who.sessions.SendMessage(
            s.SendMessageRequest(workspace_id=WS, session_id=session_id, text="let me in")
        )
    )
    await not_found(
        who.sessions.UpdateSessionMembers(
            s.UpdateSessionMembersRequest(workspace_id=WS, session_id=session_id, add=["key:eve"])
        )
    )
    r = run_pb2
    await not_found(who.runs.GetRun(r.GetRunRequest(workspace_id=WS, run_id=run_id)))
    await not_found(who.runs.ListRunSteps(r.ListRunStepsRequest(workspace_id=WS, run_id=run_id)))
    await not_found(who.runs.CancelRun(r.CancelRunRequest(workspace_id=WS, run_id=run_id)))
    watch = who.runs.WatchRun(r.WatchRunRequest(workspace_id=WS, run_id=run_id))
    await not_found(anext(aiter(watch)))
    for path in (f"_agentrun/sessions/{session_id}", f"_agentrun/runs/{run_id}"):
        read = who.streams.ReadStream(stream_pb2.ReadStreamRequest(workspace_id=WS, path=path))
        await not_found(anext(aiter(read)))
    for path in (
        f"sessions/{session_id}",
        f"sessions/{session_id}/turns",
        f"runs/{run_id}",
        f"runs/{run_id}/steps",
        f"streams/_agentrun/sessions/{session_id}",
        f"streams/_agentrun/runs/{run_id}",
    ):
        answer = await who.http(path, **({"offset": "-1"} if "streams/" in path else {}))
        assert answer.status_code == 404, (path, answer.status_code, answer.text)
        assert "private" not in answer.text.lower() and "member" not in answer.text.lower()
    assert session_id not in await who.session_ids()
    assert run_id not in await who.run_ids()


async def test_a_private_session_is_seen_by_its_members_and_admins_only(
    db_url, control_plane
) -> None:
    cp = control_plane(db_url)
    admin_api = await Api.connect(cp.address, db_url, WS)
    await admin_api.publish("helper", "demo", [])
    keys = {
        name: await auth.workspace_key(db_url, WS, role="operator", principal=name)
        for name in ("alice", "bob", "eve")
    }
    alice, bob, eve = (Reader(cp, keys[n]) for n in ("alice", "bob", "eve"))
    admin = Reader(cp, await auth.workspace_key(db_url, WS, role="admin", principal="boss"))

    made = await alice.sessions.CreateSession(
        session_pb2.CreateSessionRequest(
            workspace_id=WS,
            agent_id="helper",
            title="salaries",
            visibility=PRIVATE,
            members=["key:bob"],
        )
    )
    secret = made.session
    assert secret.visibility == PRIVATE and list(secret.members) == ["key:alice", "key:bob"]
    # Over HTTP too: JSON names the visibility in lower case.
    async with httpx.AsyncClient(headers=auth.bearer(keys["bob"]), timeout=30) as http:
        answer = await http.post(
            f"{cp.http_url}/v1/workspaces/{WS}/sessions",
            json={"agent_id": "helper", "visibility": "private", "members": ["key:alice"]},
        )
    assert answer.status_code == 201, answer.text
    assert answer.json()["visibility"] == "private"
    assert answer.json()["members"] == ["key:alice", "key:bob"]
    answer_id = answer.json()["session_id"]
    assert (await eve.http(f"sessions/{answer_id}")).status_code == 404
    public = (
        await alice.sessions.CreateSession(
            session_pb2.CreateSessionRequest(workspace_id=WS, agent_id="helper", title="lunch")
        )
    ).session
    assert public.visibility == session_pb2.SESSION_VISIBILITY_WORKSPACE
    # A member sends the private session's turn; the public one gets one too.
    turn = await bob.sessions.SendMessage(
        session_pb2.SendMessageRequest(workspace_id=WS, session_id=secret.session_id, text="raise?")
    )
    hidden_run = turn.turn.run_id
    public_run = (
        await alice.sessions.SendMessage(
            session_pb2.SendMessageRequest(
                workspace_id=WS, session_id=public.session_id, text="pizza?"
            )
        )
    ).turn.run_id

    # The outsider: NOT_FOUND (404) everywhere, never told the session exists.
    await assert_outside(eve, secret.session_id, hidden_run)
    for name, seen in [("eve", eve), ("bob", bob), ("boss", admin)]:
        http_ids, tail = await seen.feed_http()
        grpc_ids = await seen.feed_grpc()
        assert http_ids == grpc_ids, name  # the same events, in the same order
        assert {public.session_id, public_run} <= set(http_ids), name
        inside = {secret.session_id, hidden_run} & set(http_ids)
        assert inside == (set() if name == "eve" else {secret.session_id, hidden_run}), name
        # The reader's tail is its own last event: caught up there, nothing more to read.
        again = await seen.http("streams/_agentrun/feed", offset=tail)
        assert again.json() == [] and again.headers["stream-up-to-date"] == "true"
    # More hidden events than a page (500) after eve's cursor, then one she may see: her
    # next read from the cursor is that one event, not an empty page she would be stuck on.
    _, cursor = await eve.feed_http()
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute(
            "INSERT INTO workspace_events (workspace_id, kind, object_id)"
            " SELECT $1, 'run.state', $2 FROM generate_series(1, 600)",
            WS,
            hidden_run,
        )
    finally:
        await conn.close()
    later = await alice.sessions.CreateSession(
        session_pb2.CreateSessionRequest(workspace_id=WS, agent_id="helper", title="later")
    )
    answer = await eve.http("streams/_agentrun/feed", offset=cursor)
    assert [e["id"] for e in answer.json()] == [later.session.session_id]
    assert answer.headers["stream-up-to-date"] == "true"
    assert answer.headers["stream-next-offset"] > cursor

    # Eve's feed is the admin's without the private session's events, in the same order.
    admin_ids, _ = await admin.feed_http()
    eve_ids, _ = await eve.feed_http()
    theirs = (secret.session_id, hidden_run, answer_id)
    assert eve_ids == [i for i in admin_ids if i not in theirs]
    assert eve_ids.count(public_run) >= 1

    # Members and admins see it through every door.
    for seen in (bob, admin):
        got = await seen.sessions.GetSession(
            session_pb2.GetSessionRequest(workspace_id=WS, session_id=secret.session_id)
        )
        assert got.session.last_turn.run_id == hidden_run
        assert secret.session_id in await seen.session_ids()
        assert hidden_run in await seen.run_ids()
        answer = await seen.http(f"streams/_agentrun/sessions/{secret.session_id}", offset="-1")
        assert answer.status_code == 200 and answer.json()[0]["run_id"] == hidden_run
        assert (await seen.http(f"runs/{hidden_run}")).status_code == 200

    # Bad members are refused by name.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await alice.sessions.UpdateSessionMembers(
            session_pb2.UpdateSessionMembersRequest(
                workspace_id=WS, session_id=secret.session_id, add=["eve"]
            )
        )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "add" in (refused.value.details() or "")

    # Adding eve shows her the session, its past included; removing her hides it again.
    added = await alice.sessions.UpdateSessionMembers(
        session_pb2.UpdateSessionMembersRequest(
            workspace_id=WS, session_id=secret.session_id, add=["key:eve"]
        )
    )
    assert list(added.session.members) == ["key:alice", "key:bob", "key:eve"]
    assert (await eve.http(f"sessions/{secret.session_id}")).status_code == 200
    assert {secret.session_id, hidden_run} <= set((await eve.feed_http())[0])
    assert hidden_run in await eve.run_ids()
    body = {"remove": ["key:eve"]}
    async with httpx.AsyncClient(headers=auth.bearer(keys["alice"]), timeout=30) as http:
        answer = await http.post(
            f"{cp.http_url}/v1/workspaces/{WS}/sessions/{secret.session_id}/members", json=body
        )
    assert answer.status_code == 200, answer.text
    assert answer.json()["members"] == ["key:alice", "key:bob"]
    await assert_outside(eve, secret.session_id, hidden_run)

    # A bulk cancel by the outsider acts on what it sees: the public turn, not the private.
    bulk = eve.runs.BulkCancelRuns(run_pb2.BulkCancelRunsRequest(workspace_id=WS, all=True))
    progress = [p async for p in bulk]
    assert progress[-1].done == 1, progress[-1]
    by_admin = admin.runs.GetRun
    hidden = await by_admin(run_pb2.GetRunRequest(workspace_id=WS, run_id=hidden_run))
    shown = await by_admin(run_pb2.GetRunRequest(workspace_id=WS, run_id=public_run))
    assert hidden.run.status == run_pb2.RUN_STATUS_QUEUED
    assert shown.run.status == run_pb2.RUN_STATUS_CANCELLED

    for who in (alice, bob, eve, admin):
        await who.channel.close()
    await admin_api.close()


async def test_everything_below_a_private_turn_stays_private(
    db_url, control_plane, sandbox_model, sandbox_providers, executor_factory
) -> None:
    """The whole descent of a private turn (a child, its three children, a member's fork of
    a grandchild and a fork of that fork) is the session's (runs.session_id): an outsider
    sees none of it in GetRun, ListRuns (forks too), the console's list and counts, or a
    bulk action's `matched`; a member sees it all."""
    cp = control_plane(db_url)
    admin_api = await Api.connect(cp.address, db_url, WS)
    await admin_api.publish("top", "grandparent", ["start_child"])
    await admin_api.publish("mid", "parent3", ["start_child"])
    await admin_api.publish("kid", "echo_input", ["echo"])
    keys = {
        name: await auth.workspace_key(db_url, WS, role="operator", principal=name)
        for name in ("alice", "eve")
    }
    alice, eve = Reader(cp, keys["alice"]), Reader(cp, keys["eve"])
    secret = (
        await alice.sessions.CreateSession(
            session_pb2.CreateSessionRequest(workspace_id=WS, agent_id="top", visibility=PRIVATE)
        )
    ).session
    turn = await alice.sessions.SendMessage(
        session_pb2.SendMessageRequest(workspace_id=WS, session_id=secret.session_id, text="hi")
    )
    public_run = await admin_api.start("kid", "hello")
    executor_factory(cp)
    await admin_api.wait_terminal([turn.turn.run_id, public_run], within=90)
    conn = await asyncpg.connect(db_url)
    try:
        rows = await conn.fetch(
            "SELECT run_id::text AS run_id, parent_run_id::text AS parent, session_id::text AS"
            " session_id FROM runs WHERE workspace_id = $1",
            WS,
        )
    finally:
        await conn.close()
    mid = next(r["run_id"] for r in rows if r["parent"] == turn.turn.run_id)
    grandchildren = [r["run_id"] for r in rows if r["parent"] == mid]
    assert len(grandchildren) == 3
    # A member forks a grandchild, and forks the fork: both stay the session's.
    fork = (
        await alice.runs.ForkRun(run_pb2.ForkRunRequest(run_id=grandchildren[0], from_seq=0))
    ).run.run_id
    fork2 = (await alice.runs.ForkRun(run_pb2.ForkRunRequest(run_id=fork, from_seq=0))).run.run_id
    hidden = {turn.turn.run_id, mid, *grandchildren, fork, fork2}
    assert {r["run_id"] for r in rows if r["session_id"] == secret.session_id} | {
        fork,
        fork2,
    } == hidden

    r = run_pb2
    for run_id in hidden:
        await not_found(eve.runs.GetRun(r.GetRunRequest(workspace_id=WS, run_id=run_id)))
        await alice.runs.GetRun(r.GetRunRequest(workspace_id=WS, run_id=run_id))
    eve_runs = await eve.run_ids()
    assert public_run in eve_runs and not hidden & set(eve_runs)
    assert hidden <= set(await alice.run_ids())
    forks_of = r.ListRunsRequest(workspace_id=WS, forked_from_run_id=grandchildren[0])
    assert [x.run_id for x in (await alice.runs.ListRuns(forks_of)).runs] == [fork]
    assert list((await eve.runs.ListRuns(forks_of)).runs) == []
    # A bulk action counts (and acts on) only what its caller sees.
    for who, seen in ((eve, len(eve_runs)), (alice, len(eve_runs) + len(hidden))):
        dry = r.BulkRerunRunsRequest(workspace_id=WS, all=True, dry_run=True)
        progress = [p async for p in who.runs.BulkRerunRuns(dry)]
        assert progress[-1].matched == seen
    # The console's runs list and its counts, over HTTP with eve's key.
    async with httpx.AsyncClient(base_url=cp.http_url, timeout=30) as client:
        form = await client.get("/console/signin")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert csrf, form.text
        signed = await client.post(
            "/console/signin/key",
            data={"csrf": csrf[1], "key": keys["eve"], "next": "/console/runs"},
        )
        assert signed.status_code == 303, signed.text
        page = await client.get("/console/runs")
        assert page.status_code == 200
        assert public_run in page.text and not [h for h in hidden if h in page.text]
        assert f'data-count="all">{len(eve_runs)}<' in page.text
        mine = await client.get("/console/runs", params={"search": grandchildren[0]})
        assert grandchildren[0] not in mine.text
    for who in (alice, eve):
        await who.channel.close()
    await admin_api.close()
