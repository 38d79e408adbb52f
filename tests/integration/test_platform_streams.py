"""The streams the platform writes (control_plane/http/stream_views.py), read with the
ecosystem's own clients, unchanged: a run's stream read by the Python `durable-streams`
client from offset -1 while the run is under way and tailed to its end, a second reader
(the Node `@durable-streams/client`, tests/streams-conformance/read_stream.mjs) joining
mid-run from offset -1 and receiving the same values in the same order, catch-up reads
byte-identical; a session's stream; and the workspace feed read from a cursor exactly once.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

import httpx
from durable_streams import astream

from agentrun.v1 import run_pb2, session_pb2, session_pb2_grpc, stream_pb2, stream_pb2_grpc
from control_plane.dispatch import delta_store
from control_plane.dispatch.delta_store import DeltaStore
from tests.harness import auth
from tests.harness.agentrun_api import Api
from tests.integration.test_durable_streams_conformance import SUITE, installed
from tests.integration.test_fast_path import TOKEN, fast_session, free_slot, send

WS = "ws"
TERMINAL = ("RUN_STATUS_COMPLETED", "RUN_STATUS_FAILED", "RUN_STATUS_CANCELLED")


def streams_url(cp: Any, path: str) -> str:
    return f"{cp.http_url}/v1/workspaces/{WS}/streams/_agentrun/{path}"


async def catch_up(url: str, key: str, offset: str = "-1") -> tuple[bytes, str]:
    """One catch-up read: the raw body and Stream-Next-Offset."""
    async with httpx.AsyncClient(headers=auth.bearer(key), timeout=30) as http:
        answer = await http.get(url, params={"offset": offset})
    assert answer.status_code == 200, answer.text
    return answer.content, answer.headers["stream-next-offset"]


async def grpc_watch(api: Api, run_id: str, offset: str) -> list[run_pb2.WatchRunResponse]:
    """A gRPC WatchRun of an ended run from a stream offset: its step events."""
    request = run_pb2.WatchRunRequest(workspace_id=WS, run_id=run_id, offset=offset)
    return [w async for w in api.runs.WatchRun(request) if w.HasField("step")]


async def grpc_read(api: Api, path: str, offset: str) -> list[stream_pb2.ReadStreamResponse]:
    """A catch-up ReadStream over gRPC: its messages, then its up-to-date response."""
    stub = stream_pb2_grpc.StreamServiceStub(api.channel)
    request = stream_pb2.ReadStreamRequest(workspace_id=WS, path=path, offset=offset)
    return [r async for r in stub.ReadStream(request)]


async def feed_events(url: str, key: str, offset: str) -> tuple[list[dict[str, Any]], str]:
    """The feed from `offset` to now with the Python client (catch-up only), and its cursor."""
    events: list[dict[str, Any]] = []
    async with astream(url, offset=offset, live=False, headers=auth.bearer(key)) as res:
        async for item in res.iter_json():
            events.append(item)
        return events, res.offset


async def test_a_runs_stream_is_read_by_both_clients_while_it_runs_and_the_feed_once(
    db_url, control_plane, executor_factory
) -> None:
    node = shutil.which("node")
    assert node, "node is not on PATH (Debian: apt-get install nodejs npm)"
    installed(shutil.which("npm") or "npm")
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url, WS)
    await api.publish("slow", "slow_echo", ["echo"])
    # Steps only here: a reader inside a call's deltas gets them, one joining after its
    # decision committed does not (compacted), so two readers' bytes are compared on steps.
    executor_factory(cp, AGENTRUN_MODEL_STREAM="off")
    key = await auth.workspace_key(db_url, WS, role="reader")
    feed = streams_url(cp, "feed")
    _, cursor = await catch_up(feed, key)  # the feed's cursor before anything runs

    run_id = await api.start("slow", "echo four times")
    url = streams_url(cp, f"runs/{run_id}")
    values: list[dict[str, Any]] = []
    node_reader: asyncio.subprocess.Process | None = None
    status_when_joined = ""
    async with astream(url, offset="-1", live="long-poll", headers=auth.bearer(key)) as res:
        async for item in res.iter_json():
            values.append(item)
            if node_reader is None:  # a second reader joins from offset -1 mid-run
                status_when_joined = (await api.get(run_id)).status
                node_reader = await asyncio.create_subprocess_exec(
                    node,
                    str(SUITE / "read_stream.mjs"),
                    url,
                    key,
                    cwd=SUITE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                )
            if item["step"]["kind"] == "finish":
                break
    assert node_reader is not None
    out, err = await asyncio.wait_for(node_reader.communicate(), timeout=60)
    assert node_reader.returncode == 0, err.decode()
    *lines, closed = out.decode().splitlines()

    assert status_when_joined not in TERMINAL, "the run ended before the second reader joined"
    seqs = [v["step"].get("seq", 0) for v in values]
    assert seqs == list(range(len(values))) and len(values) >= 10, seqs
    assert [json.loads(line) for line in lines] == values  # same values, same order
    assert closed.startswith("#closed true "), closed  # the ended run's stream is closed
    first, tail = await catch_up(url, key)
    again, _ = await catch_up(url, key)
    assert first == again and json.loads(first) == values  # byte-identical for every reader
    assert closed.split()[-1] == tail

    # gRPC WatchRun from an offset of the stream serves the same steps, in the same order,
    # each with its offset there: a reader may move between the two doors.
    watched = await grpc_watch(api, run_id, "-1")
    assert [w.step.seq for w in watched] == seqs and watched[-1].offset == tail
    middle = watched[3].offset
    body, _ = await catch_up(url, key, middle)
    assert json.loads(body) == values[4:]
    assert [w.step.seq for w in await grpc_watch(api, run_id, middle)] == seqs[4:]

    # The feed from the cursor taken before the run: this run's events, each once, and
    # nothing more from the cursor after them.
    events, cursor2 = await feed_events(feed, key, cursor)
    mine = [(e["event"], e["detail"].get("status")) for e in events if e["id"] == run_id]
    assert mine == [("run.created", "queued"), ("run.state", "running"), ("run.state", "completed")]
    assert all(e["id"] == run_id for e in events), events
    later, cursor3 = await feed_events(feed, key, cursor2)
    assert later == [] and cursor3 == cursor2

    # A session's stream: its turn's steps in order, under the turn's number.
    sessions = session_pb2_grpc.SessionServiceStub(api.channel)
    created = await sessions.CreateSession(
        session_pb2.CreateSessionRequest(workspace_id=WS, agent_id="slow", title="s")
    )
    session_id = created.session.session_id
    turn = (
        await sessions.SendMessage(
            session_pb2.SendMessageRequest(workspace_id=WS, session_id=session_id, text="hi")
        )
    ).turn
    await api.wait_terminal([turn.run_id])
    body, _ = await catch_up(streams_url(cp, f"sessions/{session_id}"), key)
    turns = json.loads(body)
    assert {t["turn"] for t in turns} == {1} and {t["run_id"] for t in turns} == {turn.run_id}
    assert [t["step"].get("seq", 0) for t in turns] == list(range(len(turns)))
    events, cursor4 = await feed_events(feed, key, cursor3)
    assert ("session.created", session_id) in [(e["event"], e["id"]) for e in events]

    # gRPC's StreamService reads the same streams at the same offsets, for the same reader
    # (a reader's steps are projections, docs/streams.md "What each role sees").
    as_reader = Api(cp.address, WS, key, db_url)
    read = await grpc_read(as_reader, "_agentrun/feed", cursor3)
    assert [v for r in read[:-1] for v in json.loads(r.data)] == events
    assert read[-1].up_to_date and not read[-1].closed and read[-1].offset == cursor4
    read = await grpc_read(as_reader, f"_agentrun/sessions/{session_id}", "-1")
    assert [v for r in read[:-1] for v in json.loads(r.data)] == turns
    read = await grpc_read(as_reader, f"_agentrun/runs/{run_id}", "-1")
    assert [v for r in read[:-1] for v in json.loads(r.data)] == values
    assert read[-1].closed and read[-1].offset == tail
    await as_reader.close()

    # A reader may not write; an operator may write its own streams, never the platform's.
    operator = await auth.workspace_key(db_url, WS, role="operator")
    mine = f"{cp.http_url}/v1/workspaces/{WS}/streams/notes"
    async with httpx.AsyncClient(timeout=30) as http:
        refused = await http.put(mine, headers=auth.bearer(key))
        assert refused.status_code == 403, refused.text
        made = await http.put(mine, headers=auth.bearer(operator))
        assert made.status_code == 201, made.text
        json_body = {**auth.bearer(operator), "content-type": "application/json"}
        refused = await http.post(url, content=b"{}", headers=json_body)
        assert refused.status_code == 405, refused.text
        # A live gRPC reader of a workspace stream gets each append, then the closing.
        request = stream_pb2.ReadStreamRequest(workspace_id=WS, path="notes", live=True)
        live = stream_pb2_grpc.StreamServiceStub(api.channel).ReadStream(request)
        first = await live.read()
        assert first.up_to_date and not first.data
        octets = {**auth.bearer(operator), "content-type": "application/octet-stream"}
        for part in (b"one ", b"two"):
            assert (await http.post(mine, content=part, headers=octets)).status_code == 204
        closing = {**auth.bearer(operator), "stream-closed": "true"}
        assert (await http.post(mine, headers=closing)).status_code == 204
        heard = [r async for r in live]
        assert b"".join(r.data for r in heard) == b"one two" and heard[-1].closed
        # Bad input is a 400 naming what is wrong.
        too_long = await http.put(f"{mine}/{'x' * 1100}", headers=auth.bearer(operator))
        assert too_long.status_code == 400 and "path" in too_long.text, too_long.text
        producer = {"producer-id": "p" * 1100, "producer-epoch": "0", "producer-seq": "0"}
        refused = await http.post(mine, content=b"x", headers={**json_body, **producer})
        assert refused.status_code == 400 and "Producer-Id" in refused.text, refused.text
    await api.close()


async def test_a_second_reader_joining_mid_call_from_offset_0_gets_the_same_deltas(
    db_url, control_plane, executor_factory
) -> None:
    """A fast-path turn streams its answer slowly: the run's stream serves the deltas as
    they come, between the input and the decision; a Node reader joining from offset -1
    while the model is still generating receives exactly what the Python reader did; once
    the decision commits, the stream is compacted to it."""
    node = shutil.which("node")
    assert node, "node is not on PATH (Debian: apt-get install nodejs npm)"
    installed(shutil.which("npm") or "npm")
    cp = control_plane(db_url, AGENTRUN_METRICS_TOKEN=TOKEN)
    api = await Api.connect(cp.address, db_url, WS)
    executor_factory(cp)
    await free_slot(cp)
    session_id = await fast_session(api, "streamer", "slow_stream", [])
    key = await auth.workspace_key(db_url, WS, role="reader")
    run_id = (await send(api, session_id, "tell me slowly")).run_id
    url = streams_url(cp, f"runs/{run_id}")
    values: list[dict[str, Any]] = []
    node_reader: asyncio.subprocess.Process | None = None
    async with astream(url, offset="-1", live="long-poll", headers=auth.bearer(key)) as res:
        async for item in res.iter_json():
            values.append(item)
            if node_reader is None and "delta" in item:  # mid-call: join from offset -1
                node_reader = await asyncio.create_subprocess_exec(
                    node,
                    str(SUITE / "read_stream.mjs"),
                    url,
                    key,
                    cwd=SUITE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                )
            if "step" in item and item["step"]["kind"] == "finish":
                break
    assert node_reader is not None, values
    out, err = await asyncio.wait_for(node_reader.communicate(), timeout=60)
    assert node_reader.returncode == 0, err.decode()
    *lines, closed = out.decode().splitlines()
    assert [json.loads(line) for line in lines] == values  # the same, in the same order
    assert closed.startswith("#closed true "), closed

    deltas = [v["delta"] for v in values if "delta" in v]
    assert len(deltas) >= 10 and [d["index"] for d in deltas] == list(range(len(deltas)))
    decision = next(v["step"] for v in values if v.get("step", {}).get("kind") == "model_decision")
    assert deltas[0]["seq"] == decision.get("seq", 0)
    text = "".join(d["text"] for d in deltas)
    assert text and text in json.dumps(decision, ensure_ascii=False).replace('\\"', '"'), text
    body, _ = await catch_up(url, key)  # compacted to the decision once it committed
    assert [v for v in json.loads(body) if "delta" in v] == []
    assert json.loads(body) == [v for v in values if "step" in v]
    await api.close()


async def test_a_reader_whose_replica_is_killed_resumes_on_another_from_its_offset(
    db_url, control_plane, executor_factory
) -> None:
    """kill -9 of the replica serving a live read: the Python client reads on from its last
    offset on another replica, missing nothing and repeating nothing."""
    serving, other = control_plane(db_url), control_plane(db_url)
    api = await Api.connect(other.address, db_url, WS)
    await api.publish("slow", "slow_echo", ["echo"])
    executor_factory(other)
    key = await auth.workspace_key(db_url, WS, role="reader")
    run_id = await api.start("slow", "echo four times")
    values: list[dict[str, Any]] = []
    offset = "-1"
    killed, read_before = False, 0
    for cp in (serving, other):
        url = streams_url(cp, f"runs/{run_id}")
        try:
            async with astream(
                url, offset=offset, live="long-poll", headers=auth.bearer(key)
            ) as res:
                async for batch in res.iter_json_batches():
                    # The steps (the calls' deltas, compacted once their decisions
                    # commit, are read or not depending on when the reader comes by).
                    values += [v for v in batch if "step" in v]
                    offset = res.offset  # where this batch ends: the cursor to resume from
                    if not killed:
                        assert (await api.get(run_id)).status not in TERMINAL
                        serving.kill()  # SIGKILL, mid-run
                        killed, read_before = True, len(values)
                    if any(v["step"]["kind"] == "finish" for v in batch if "step" in v):
                        break
        except httpx.HTTPError:
            assert cp is serving  # the killed replica's read fails; the other serves on
    assert killed and len(values) > read_before  # the other replica served the rest
    seqs = [v["step"].get("seq", 0) for v in values]
    assert seqs == list(range(len(values))) and values[-1]["step"]["kind"] == "finish", seqs
    body, _ = await catch_up(streams_url(other, f"runs/{run_id}"), key)
    assert json.loads(body) == values  # compacted: the steps alone
    await api.close()


async def test_deltas_land_once_and_only_from_the_holder_of_the_run(
    db_url, control_plane, executor_factory, pool
) -> None:
    """The delta store's write (control_plane/dispatch/delta_store.py) keeps a delta only
    while its epoch holds the run and its decision is not committed, and at most once."""
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url, WS)
    await api.publish("slow", "slow_echo", ["echo"])
    executor_factory(cp, AGENTRUN_MODEL_STREAM="off")  # only this test's deltas are kept
    run_id = await api.start("slow", "echo four times")
    holder = None
    for _ in range(600):  # the executor starts, and passes its canary, first
        holder = await pool.fetchrow(
            "SELECT lease_epoch, (SELECT max(seq) FROM steps s WHERE s.workspace_id = r.workspace_id"
            " AND s.run_id = r.run_id) AS last FROM runs r WHERE run_id = $1 AND status = 'running'",
            uuid.UUID(run_id),
        )
        if holder is not None:
            break
        await asyncio.sleep(0.05)
    assert holder is not None, "the run never ran"
    epoch, ahead = holder["lease_epoch"], holder["last"] + 50  # a decision far ahead
    soon = holder["last"] + 3
    kept = DeltaStore(pool)
    for delta in (
        run_pb2.RunDelta(epoch=epoch, seq=ahead, index=0, text="held "),
        run_pb2.RunDelta(epoch=epoch, seq=ahead, index=0, text="held again"),  # a retry
        run_pb2.RunDelta(epoch=epoch - 1, seq=ahead, index=1, text="fenced"),  # an old holder
        run_pb2.RunDelta(epoch=epoch, seq=0, index=0, text="too late"),  # step 0 committed
        run_pb2.RunDelta(epoch=epoch, seq=soon, index=0, text="soon"),  # committed later
    ):
        kept.offer(WS, uuid.UUID(run_id), delta)
    await kept.flush()
    rows = await pool.fetch(
        "SELECT seq, epoch, idx, text FROM run_deltas WHERE run_id = $1 ORDER BY seq",
        uuid.UUID(run_id),
    )
    assert [tuple(r) for r in rows] == [(soon, epoch, 0, "soon"), (ahead, epoch, 0, "held ")]
    await api.wait_terminal([run_id])

    # The sweep: compacted deltas (a minute after), feed events past 30 days, streams
    # past their TTL go; the rest stays.
    await pool.execute("UPDATE run_deltas SET created_at = now() - interval '2 minutes'")
    oldest = await pool.fetchval("SELECT min(event_id) FROM workspace_events")
    await pool.execute(
        "UPDATE workspace_events SET at = now() - interval '31 days' WHERE event_id = $1", oldest
    )
    operator = await auth.workspace_key(db_url, WS, role="operator")
    async with httpx.AsyncClient(headers=auth.bearer(operator), timeout=30) as http:
        for name, ttl in (("brief", "0"), ("kept", "3600")):
            made = await http.put(
                f"{cp.http_url}/v1/workspaces/{WS}/streams/{name}", headers={"Stream-TTL": ttl}
            )
            assert made.status_code == 201, made.text
    events = await pool.fetchval("SELECT count(*) FROM workspace_events")
    await delta_store.sweep(pool)
    rows = await pool.fetch("SELECT seq FROM run_deltas WHERE run_id = $1", uuid.UUID(run_id))
    assert [r["seq"] for r in rows] == [ahead]
    assert await pool.fetchval("SELECT count(*) FROM workspace_events") == events - 1
    assert [r["path"] for r in await pool.fetch("SELECT path FROM streams")] == ["kept"]
    await api.close()


async def test_a_killed_executors_deltas_are_followed_by_the_new_holders_after_a_break(
    db_url, control_plane, executor_factory, pool
) -> None:
    """Every agent's model output is streamed, not only the fast path's. kill -9 of the
    executor mid-generation: the run's stream shows the old holder's deltas, a break naming
    the new epoch, then the new holder's deltas (index from 0, asking again) and its
    decision; a late delta of the old epoch is refused."""
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url, WS)
    await api.publish("streamer", "slow_stream", [])  # not a fast-path agent
    (doomed,) = executor_factory(cp)
    key = await auth.workspace_key(db_url, WS, role="reader")
    run_id = await api.start("streamer", "tell me slowly")
    url = streams_url(cp, f"runs/{run_id}")
    values: list[dict[str, Any]] = []
    late_tried = False
    async with astream(url, offset="-1", live="long-poll", headers=auth.bearer(key)) as res:
        async for item in res.iter_json():
            values.append(item)
            if doomed.alive and len([v for v in values if "delta" in v]) >= 3:
                doomed.kill()  # SIGKILL, mid-generation
                executor_factory(cp)
            if "break" in item and not late_tried:  # the new holder streams: the old one
                late_tried = True  # appends late, at its own epoch, and is refused
                old = next(v["delta"] for v in values if "delta" in v)
                kept = DeltaStore(pool)
                late = run_pb2.RunDelta(epoch=old["epoch"], seq=old["seq"], index=999, text="late")
                kept.offer(WS, uuid.UUID(run_id), late)
                await kept.flush()
            if "step" in item and item["step"]["kind"] == "finish":
                break
    assert doomed.returncode == -9 and late_tried, values
    kinds = ["break" if "break" in v else "delta" if "delta" in v else "step" for v in values]
    cut = kinds.index("break")
    before = [v["delta"] for v in values[:cut] if "delta" in v]
    after = [v["delta"] for v in values[cut + 1 :] if "delta" in v]
    brk = values[cut]["break"]
    decision = next(v["step"] for v in values if v.get("step", {}).get("kind") == "model_decision")
    assert len(before) >= 3 and {d["epoch"] for d in before} == {before[0]["epoch"]}
    assert brk == {"seq": before[0]["seq"], "epoch": after[0]["epoch"]}
    assert brk["epoch"] > before[0]["epoch"] and decision["epoch"] == brk["epoch"]
    assert [d["index"] for d in after] == list(range(len(after)))
    assert {d["epoch"] for d in after} == {brk["epoch"]} and "late" not in json.dumps(values)
    text = "".join(d["text"] for d in after)  # the new holder's whole answer
    assert text.startswith("".join(d["text"] for d in before)), (before, text)
    # The decision is the record: the last chunks may come after it committed, and are
    # then not kept (a reader is past them), so the deltas are its text or the start of it.
    assert len(after) >= 10 and decision["payload"]["content"].startswith(text), decision
    assert kinds[cut + 1 + len(after) :] == ["step", "step"]  # the decision, the finish
    late_rows = await pool.fetchval("SELECT count(*) FROM run_deltas WHERE text = 'late'")
    assert late_rows == 0
    await api.close()


async def test_a_feed_reader_offline_for_an_hour_catches_up_from_its_cursor_exactly_once(
    db_url, control_plane, pool
) -> None:
    """A reader keeps its cursor and goes away for an hour of the database's clock (the
    events' times are moved back an hour, and the hourly sweep has run meanwhile): from
    its cursor it gets every event since, each once and in commit order; one written by a
    transaction still open while it catches up is held back, not skipped, and comes on
    its next read; and a read from the last cursor gets nothing more."""
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url, WS)
    await api.publish("idle", "slow_echo", ["echo"])  # no executor: runs stay queued
    key = await auth.workspace_key(db_url, WS, role="reader")
    feed = streams_url(cp, "feed")
    _, cursor = await catch_up(feed, key)
    before = await pool.fetchval(
        "SELECT coalesce(max(event_id), 0) FROM workspace_events WHERE workspace_id = $1", WS
    )

    runs = [await api.start("idle", f"while away {i}") for i in range(3)]
    await api.runs.CancelRun(run_pb2.CancelRunRequest(workspace_id=WS, run_id=runs[0]))
    # An hour goes by on the database's clock: what was written since the cursor is an
    # hour old, and the sweep (30 days of events kept) has run.
    # (Read, then written back as values: Citus refuses a stable function over a column,
    # `at - interval`, in an UPDATE.)
    written = await pool.fetch(
        "SELECT workspace_id, event_id, at FROM workspace_events WHERE event_id > $1", before
    )
    for row in written:
        await pool.execute(
            "UPDATE workspace_events SET at = $3 WHERE workspace_id = $1 AND event_id = $2",
            row["workspace_id"],
            row["event_id"],
            row["at"] - timedelta(hours=1),
        )
    await delta_store.sweep(pool)
    expected = [
        (r["kind"], r["object_id"])
        for r in await pool.fetch(
            "SELECT kind, object_id FROM workspace_events WHERE workspace_id = $1"
            " AND event_id > $2 ORDER BY xid, event_id",
            WS,
            before,
        )
    ]
    assert [k for k, _ in expected] == ["run.created"] * 3 + ["run.state"], expected

    async with pool.acquire() as conn, conn.transaction():  # a writer still at work
        await conn.execute(
            "INSERT INTO workspace_events (workspace_id, kind, object_id) VALUES ($1, $2, $3)",
            WS,
            "test.open",
            "open",
        )
        events, cursor2 = await feed_events(feed, key, cursor)
        assert [(e["event"], e["id"]) for e in events] == expected  # each once, in order
        assert all(e["detail"] for e in events)
        ages = [time.time() - datetime.fromisoformat(e["at"]).timestamp() for e in events]
        assert all(3500 < age < 3700 for age in ages), ages  # written an hour ago
        held, cursor3 = await feed_events(feed, key, cursor2)
        assert held == [] and cursor3 == cursor2  # not served while it may yet commit
    events, cursor4 = await feed_events(feed, key, cursor2)
    assert [(e["event"], e["id"]) for e in events] == [("test.open", "open")]
    again, cursor5 = await feed_events(feed, key, cursor4)
    assert again == [] and cursor5 == cursor4
    await api.close()
