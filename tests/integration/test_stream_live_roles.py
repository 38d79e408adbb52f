"""Live readers of one platform stream with different roles and principals (issue 42 item 4,
docs/streams.md "What each role sees"): the readers one step wakes share their reads only
with readers of the same projection, each gets its own role's shape of every step, and a
private session's live reader stops being served the moment it is no longer a member.

Real server, executor and sandbox model, real keys; the sharing is read from the server's
/metrics (agentrun_stream_live_reads_total: asked or shared, by question and projection).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from agentrun.v1 import run_pb2, session_pb2, session_pb2_grpc
from tests.harness import auth
from tests.harness.agentrun_api import Api
from tests.integration.test_fast_path import TOKEN
from tests.integration.test_role_projections import HIDDEN, check

WS = "ws"
LIVE_READS = "agentrun_stream_live_reads_total"


async def live_reads(cp: Any) -> dict[tuple[str, str, str], float]:
    """The server's count of woken live readers' reads: (question, projection, outcome)."""
    async with httpx.AsyncClient(timeout=10) as http:
        reply = await http.get(
            f"{cp.http_url}/metrics", headers={"authorization": f"Bearer {TOKEN}"}
        )
    reply.raise_for_status()
    return {
        (s.labels["question"], s.labels["projection"], s.labels["outcome"]): s.value
        for family in text_string_to_metric_families(reply.text)
        for s in family.samples
        if s.name == LIVE_READS
    }


async def tail_sse(url: str, key: str, ready: asyncio.Event, until: str) -> list[str]:
    """A live SSE read from offset -1: the data events' payloads (each a JSON array, as the
    server sent it), until a step of kind `until`; `ready` once caught up."""
    datas: list[str] = []
    params = {"offset": "-1", "live": "sse"}
    async with (
        httpx.AsyncClient(headers=auth.bearer(key), timeout=60) as http,
        http.stream("GET", url, params=params) as res,
    ):
        assert res.status_code == 200, await res.aread()
        event = ""
        async for line in res.aiter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:") and event == "control":
                if json.loads(line[5:]).get("upToDate"):
                    ready.set()
            elif line.startswith("data:") and event == "data":
                datas.append(line[5:])
                if any(v.get("step", {}).get("kind") == until for v in json.loads(line[5:])):
                    return datas
    return datas


def steps_of(datas: list[str]) -> list[tuple[str, dict[str, Any]]]:
    values = [v for d in datas for v in json.loads(d)]
    return [(v["step"]["kind"], v["step"]["payload"]) for v in values]


async def test_live_readers_share_reads_only_with_their_own_projection(
    db_url, control_plane, executor_factory
) -> None:
    cp = control_plane(db_url, AGENTRUN_METRICS_TOKEN=TOKEN)
    api = await Api.connect(cp.address, db_url, WS)
    await api.publish("slow", "slow_echo", ["echo"])
    keys = {
        "reader-1": await auth.workspace_key(db_url, WS, role="reader", principal="reader-1"),
        "reader-2": await auth.workspace_key(db_url, WS, role="reader", principal="reader-2"),
        "operator": await auth.workspace_key(db_url, WS, role="operator", principal="op-1"),
    }
    run_id = await api.start("slow", "echo four times")
    url = f"{cp.http_url}/v1/workspaces/{WS}/streams/_agentrun/runs/{run_id}"
    ready = {name: asyncio.Event() for name in keys}
    reads = {
        name: asyncio.create_task(tail_sse(url, key, ready[name], "finish"))
        for name, key in keys.items()
    }
    await asyncio.wait_for(asyncio.gather(*(r.wait() for r in ready.values())), 30)
    before = await live_reads(cp)
    # Steps only (deltas are the same for every role, and compacted by when one reads).
    executor_factory(cp, AGENTRUN_MODEL_STREAM="off")  # the run's steps come while tailed
    got = {name: await asyncio.wait_for(task, 90) for name, task in reads.items()}
    after = await live_reads(cp)
    (ended,) = await api.wait_terminal([run_id], within=30)
    assert ended.status == run_pb2.RUN_STATUS_COMPLETED, ended.error

    # Each reader got its own role's shape of every step, and readers of one role the same
    # bytes.
    assert got["reader-1"] == got["reader-2"]
    check(steps_of(got["reader-1"]), whole=False, door="live reader")
    check(steps_of(got["operator"]), whole=True, door="live operator")
    projected, whole = steps_of(got["reader-1"]), steps_of(got["operator"])
    assert [k for k, _ in projected] == [k for k, _ in whole]
    for (kind, part), (_, full) in zip(projected, whole, strict=True):
        assert part == {k: v for k, v in full.items() if k not in HIDDEN.get(kind, set())}

    # The readers were woken together: one look at the run's tail for all three, one read
    # of the new steps for the two readers, none shared between a reader and the operator.
    def moved(question: str, projection: str, outcome: str) -> float:
        key = (question, projection, outcome)
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert moved("tail", "any", "shared") >= len(whole) / 2, (before, after)
    shared, asked = moved("after", "projected", "shared"), moved("after", "projected", "asked")
    assert shared >= 1 and 2 * shared >= asked, (before, after)
    assert moved("after", "whole", "shared") == 0, (before, after)
    assert moved("after", "whole", "asked") >= 1
    assert moved("members", "any", "asked") == 0  # a public run: no membership look

    # Conditional GETs: one reader's ETag validates the other reader's read (the same
    # bytes), never the operator's, nor the operator's a reader's.
    etags: dict[str, str] = {}
    bodies: dict[str, bytes] = {}
    for name, key in keys.items():
        async with httpx.AsyncClient(headers=auth.bearer(key), timeout=30) as http:
            answer = await http.get(url, params={"offset": "-1"})
            assert answer.status_code == 200, answer.text
            etags[name], bodies[name] = answer.headers["etag"], answer.content
    assert etags["reader-1"] == etags["reader-2"] != etags["operator"]
    assert bodies["reader-1"] == bodies["reader-2"] != bodies["operator"]
    for name, other, status in [
        ("reader-2", "reader-1", 304),
        ("operator", "reader-1", 200),
        ("reader-1", "operator", 200),
        ("operator", "operator", 304),
    ]:
        async with httpx.AsyncClient(headers=auth.bearer(keys[name]), timeout=30) as http:
            answer = await http.get(
                url, params={"offset": "-1"}, headers={"if-none-match": etags[other]}
            )
        assert answer.status_code == status, (name, other)
        if status == 200:
            assert answer.content == bodies[name]  # its own projection, whole
    await api.close()


async def test_a_removed_members_live_read_ends_and_sees_nothing_after(
    db_url, control_plane
) -> None:
    """A private session's stream tailed by two members: when one is removed, its live read
    ends at the tick's next look; the other reads on, and sees the next turn."""
    cp = control_plane(db_url, AGENTRUN_METRICS_TOKEN=TOKEN)
    admin = await Api.connect(cp.address, db_url, WS)
    await admin.publish("helper", "demo", [])
    owner = await auth.workspace_key(db_url, WS, role="operator", principal="alice")
    keys = {
        name: await auth.workspace_key(db_url, WS, role="reader", principal=name)
        for name in ("bob", "carol")
    }
    channel = auth.channel(cp.address, owner)
    sessions = session_pb2_grpc.SessionServiceStub(channel)
    made = await sessions.CreateSession(
        session_pb2.CreateSessionRequest(
            workspace_id=WS,
            agent_id="helper",
            visibility=session_pb2.SESSION_VISIBILITY_PRIVATE,
            members=["key:bob", "key:carol"],
        )
    )
    session_id = made.session.session_id

    async def send(text: str) -> str:
        turn = await sessions.SendMessage(
            session_pb2.SendMessageRequest(
                workspace_id=WS,
                session_id=session_id,
                text=text,
                strategy=session_pb2.SESSION_STRATEGY_ENQUEUE,
            )
        )
        return turn.turn.run_id

    first = await send("one")
    url = f"{cp.http_url}/v1/workspaces/{WS}/streams/_agentrun/sessions/{session_id}"
    seen: dict[str, list[dict[str, Any]]] = {name: [] for name in keys}
    ended: dict[str, float] = {}

    async def tail(name: str) -> None:
        async with (
            httpx.AsyncClient(headers=auth.bearer(keys[name]), timeout=60) as http,
            http.stream("GET", url, params={"offset": "-1", "live": "sse"}) as res,
        ):
            assert res.status_code == 200
            event = ""
            async for line in res.aiter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:") and event == "data":
                    seen[name] += json.loads(line[5:])
        ended[name] = time.monotonic()

    tasks = {name: asyncio.create_task(tail(name)) for name in keys}
    deadline = time.monotonic() + 30
    while not all(any(v["run_id"] == first for v in seen[n]) for n in keys):
        assert time.monotonic() < deadline, seen
        await asyncio.sleep(0.05)
    before = await live_reads(cp)
    removed = time.monotonic()
    await sessions.UpdateSessionMembers(
        session_pb2.UpdateSessionMembersRequest(
            workspace_id=WS, session_id=session_id, remove=["key:carol"]
        )
    )
    await asyncio.wait_for(tasks["carol"], 5)
    assert ended["carol"] - removed < 2.0  # at the tick's next look (every 0.25 s)
    # The look saw the members change and woke both readers, who read the members once.
    after = await live_reads(cp)
    asked, shared = (
        after.get(("members", "any", outcome), 0) - before.get(("members", "any", outcome), 0)
        for outcome in ("asked", "shared")
    )
    assert asked >= 1 and shared >= 1, (asked, shared)
    carol_saw = list(seen["carol"])
    second = await send("two")
    deadline = time.monotonic() + 30
    while not any(v["run_id"] == second for v in seen["bob"]):
        assert time.monotonic() < deadline, seen["bob"]
        await asyncio.sleep(0.05)
    assert "carol" not in ended or seen["carol"] == carol_saw
    assert all(v["run_id"] == first for v in carol_saw)
    tasks["bob"].cancel()
    async with httpx.AsyncClient(headers=auth.bearer(keys["carol"]), timeout=30) as http:
        assert (await http.get(url, params={"offset": "-1"})).status_code == 404
    await channel.close()
    await admin.close()
