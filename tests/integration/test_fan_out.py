"""Fan-out and fan-in (issue 45, item 1): one `start_children` call starts several child runs,
which run in parallel under the caps; the parent wakes once when all (or the first, or n) of
them ended, with every child's outcome in its one tool result, in list order; the parent's
close cancels the children its call asked to have cancelled, fencing their holders.

The first tests drive the commits at the store through the server's own pipeline (a resent
commit, children ending at once, the policies); the last ones run real processes: a control
plane, an executor and the sandbox model playing fan20 / fan_first."""

from __future__ import annotations

import asyncio
import json
import uuid

import asyncpg
import pytest

from agentrun.v1 import agent_pb2, run_pb2
from control_plane.runs import wait_limits
from control_plane.store import lease, runs, steps
from control_plane.store.errors import Fenced
from tests import factories
from tests.harness.agentrun_api import Api
from tests.harness.commits import pipeline
from tests.harness.invariants import assert_log_well_formed
from tests.harness.waiting import eventually

# -- the commits, at the store -------------------------------------------------------------


async def fan_parent(pool: asyncpg.Pool) -> runs.Run:
    """A held run of `boss`, with `kid` published for its children."""
    await factories.agent_version(pool, "ws", "kid")
    await factories.queued_runs(pool, 1, agent_id="boss")
    (held,) = await lease.claim_due(pool, ["ex-a"], 30)
    return held


def fan_commit(run: runs.Run, arguments: dict) -> steps.CommitRequest:
    """The commit an executor sends for a start_children call: the decision, the call's
    tool_started step and the park, in one."""
    call = {"id": "call-1", "name": "start_children", "arguments": arguments}
    decision = json.dumps({"content": "", "tool_calls": [call]})
    started = {"call_id": "call-1", "tool": "start_children", "arguments": arguments}
    started["class"] = "internal"
    return steps.CommitRequest(
        run.workspace_id,
        run.run_id,
        run.lease_epoch,
        [
            steps.NewStep(1, "model_decision", None, decision),
            steps.NewStep(2, "tool_started", 1, json.dumps(started)),
            steps.NewStep(3, "park", None, json.dumps({"wait_reason": "child"})),
        ],
        steps.Transition(status="waiting", wait_reason="child"),
    )


def kids(n: int) -> list[dict[str, str]]:
    return [{"agent_id": "kid", "input": f"c{i}"} for i in range(n)]


async def children(pool: asyncpg.Pool, parent: uuid.UUID) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT run_id, parent_seq, parent_index, parent_close, input, status, error FROM runs"
        " WHERE workspace_id = 'ws' AND parent_run_id = $1 ORDER BY parent_index",
        parent,
    )


async def results(pool: asyncpg.Pool, run_id: uuid.UUID) -> list[dict]:
    rows = await pool.fetch(
        "SELECT ref_seq, payload FROM steps WHERE workspace_id = 'ws' AND run_id = $1"
        " AND kind = 'tool_result' ORDER BY seq",
        run_id,
    )
    return [{"ref_seq": r["ref_seq"], **json.loads(r["payload"])} for r in rows]


async def end_each_at_once(db_url: str, run_ids: list[uuid.UUID]) -> list[bool]:
    """Cancel each run on its own connection, all at once (each end runs the fan-in)."""
    conns = [await asyncpg.connect(db_url) for _ in run_ids]
    try:
        done = await asyncio.gather(
            *(runs.cancel_run(c, "ws", r, "ended") for c, r in zip(conns, run_ids, strict=True))
        )
    finally:
        for c in conns:
            await c.close()
    return [d is not None for d in done]


async def test_a_resent_fan_out_commit_starts_no_second_set(pool):
    parent = await fan_parent(pool)
    req = fan_commit(parent, {"children": kids(4)})

    first = await pipeline(pool).commit(req, 30)
    again = await pipeline(pool).commit(req, 30)  # its reply lost: sent again

    assert (first.status, first.duplicate, again.duplicate) == ("waiting", False, True)
    got = await children(pool, parent.run_id)
    assert [k["input"] for k in got] == ["c0", "c1", "c2", "c3"]
    assert [k["parent_index"] for k in got] == [0, 1, 2, 3]
    assert {(k["parent_seq"], k["parent_close"], k["status"]) for k in got} == {
        (2, "cancel", "queued")
    }
    assert await results(pool, parent.run_id) == []  # nothing ended: the parent waits


async def test_children_ending_at_once_give_the_parent_one_result_in_list_order(pool, db_url):
    parent = await fan_parent(pool)
    await pipeline(pool).commit(fan_commit(parent, {"children": kids(6)}), 30)
    ids = [k["run_id"] for k in await children(pool, parent.run_id)]

    ended = await end_each_at_once(db_url, ids)
    # A child ending twice (its end resent) ends nothing and delivers nothing more.
    again = await end_each_at_once(db_url, ids[:3])

    assert ended == [True] * 6 and again == [False] * 3
    (result,) = await results(pool, parent.run_id)
    assert (result["ref_seq"], result["tool"], result["status"]) == (2, "start_children", "ok")
    assert result["output"]["ended"] == 6
    assert [c["child_run_id"] for c in result["output"]["children"]] == [str(i) for i in ids]
    assert [c["index"] for c in result["output"]["children"]] == list(range(6))
    assert {c["status"] for c in result["output"]["children"]} == {"cancelled"}
    woken = await runs.get_run(pool, "ws", parent.run_id)
    assert woken is not None and woken.status == "waiting" and woken.wake_at is not None
    assert woken.step_count == 5  # input, decision, started, park, and the one result


async def test_wait_n_wakes_at_the_nth_end_and_cancels_the_rest(pool):
    parent = await fan_parent(pool)
    await pipeline(pool).commit(fan_commit(parent, {"children": kids(4), "wait": "n", "n": 2}), 30)
    ids = [k["run_id"] for k in await children(pool, parent.run_id)]

    await runs.cancel_run(pool, "ws", ids[2], "ended")
    assert await results(pool, parent.run_id) == []
    await runs.cancel_run(pool, "ws", ids[0], "ended")

    (result,) = await results(pool, parent.run_id)
    assert result["output"]["ended"] == 2
    got = await children(pool, parent.run_id)
    assert [k["status"] for k in got] == ["cancelled"] * 4
    assert [k["error"] for k in got][1::2] == ["not waited for: the parent went on"] * 2
    assert [c["status"] for c in result["output"]["children"]] == ["cancelled"] * 4


async def test_a_bad_call_is_its_error_result_and_admits_nothing(pool):
    parent = await fan_parent(pool)
    bad = kids(3)
    bad[1] = {"agent_id": "nobody", "input": "x"}
    await pipeline(pool).commit(fan_commit(parent, {"children": bad}), 30)

    assert await children(pool, parent.run_id) == []
    (result,) = await results(pool, parent.run_id)
    assert result["status"] == "error"
    assert result["error"] == "children[1]: agent 'nobody' has no published version"


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"children": kids(2), "wait": "n"}, "wait n needs n, from 1 to the number of children"),
        ({"children": kids(2), "wait": "n", "n": 3}, "wait n needs n"),
        ({"children": kids(2), "wait": "most"}, "wait must be one of all, first, n"),
        ({"children": kids(1), "parent_close": "keep"}, "parent_close must be one of"),
        ({"children": []}, "children must list 1 to 100 objects"),
    ],
)
async def test_bad_arguments_are_refused_naming_what_is_wrong(pool, arguments, error):
    parent = await fan_parent(pool)
    await pipeline(pool).commit(fan_commit(parent, arguments), 30)
    assert await children(pool, parent.run_id) == []
    (result,) = await results(pool, parent.run_id)
    assert result["status"] == "error" and error in result["error"]


async def test_a_parent_failing_cancels_its_children_in_that_transaction(pool):
    """Failed by a sweep (it waited on its children past the workspace's limit), not by
    CancelRun: the close policy holds whichever statement ends the parent."""
    parent = await fan_parent(pool)
    await pipeline(pool).commit(fan_commit(parent, {"children": kids(3)}), 30)
    await pool.execute(  # parked a month ago: past the default limit on a child wait
        "UPDATE runs SET updated_at = now() - interval '31 days' WHERE run_id = $1",
        parent.run_id,
    )

    (failed,) = await wait_limits.fail_overdue(pool)

    assert failed["run_id"] == parent.run_id
    got = await children(pool, parent.run_id)
    assert {(k["status"], k["error"]) for k in got} == {("cancelled", "parent run failed")}
    xids = await pool.fetch(
        "SELECT DISTINCT xmin::text FROM runs WHERE run_id = $1 OR parent_run_id = $1",
        parent.run_id,
    )
    assert len(xids) == 1  # one transaction ended the parent and its children


async def test_an_abandoning_parents_cancel_leaves_its_children_running(pool):
    parent = await fan_parent(pool)
    await pipeline(pool).commit(
        fan_commit(parent, {"children": kids(2), "parent_close": "abandon"}), 30
    )
    await runs.cancel_run(pool, "ws", parent.run_id, "stop")
    assert [k["status"] for k in await children(pool, parent.run_id)] == ["queued", "queued"]


# -- real processes --------------------------------------------------------------------------


@pytest.fixture
async def stack(db_url, control_plane, sandbox_model, sandbox_providers):
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url)
    await api.publish("parent", "fan20", ["start_children"])
    db = await asyncpg.connect(db_url)
    yield cp, api, db
    await db.close()
    await api.close()


async def publish_capped(api: Api, agent_id: str, model: str, tools: list[str], cap: int) -> None:
    await api.agents.CreateAgent(
        agent_pb2.CreateAgentRequest(workspace_id=api.ws, agent_id=agent_id)
    )
    spec = agent_pb2.AgentSpec(
        model=model, instructions="test agent", tools=tools, max_concurrency=cap
    )
    await api.agents.PublishAgentVersion(
        agent_pb2.PublishAgentVersionRequest(workspace_id=api.ws, agent_id=agent_id, spec=spec)
    )


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most intervals open at one moment (one ending as another starts: not both)."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    most = now = 0
    for _, d in edges:
        now += d
        most = max(most, now)
    return most


async def running_kids(db: asyncpg.Connection) -> int:
    return await db.fetchval(
        "SELECT count(*) FROM runs WHERE workspace_id = 'ws' AND agent_id = 'kid'"
        " AND status = 'running'"
    )


async def test_twenty_children_run_five_at_a_time_and_the_parent_resumes_once_in_order(
    stack, executor_factory
):
    cp, api, db = stack
    await publish_capped(api, "kid", "fan_kid", ["echo"], cap=5)
    parent_id = await api.start("parent", "go")
    executor_factory(cp, AGENTRUN_CAPACITY=8)  # room for more than the cap (tests hold 4)
    seen: list[int] = []

    async def sample() -> None:
        while True:
            seen.append(await running_kids(db))
            await asyncio.sleep(0.05)

    sampler = asyncio.ensure_future(sample())
    try:
        (parent,) = await api.wait_terminal([parent_id], within=90)
    finally:
        sampler.cancel()
    assert parent.status == run_pb2.RUN_STATUS_COMPLETED, parent.error

    rows = await db.fetch(
        "SELECT run_id, input, status, output, started_at, finished_at FROM runs"
        " WHERE workspace_id = 'ws' AND parent_run_id = $1 ORDER BY parent_index",
        uuid.UUID(parent_id),
    )
    assert [r["input"] for r in rows] == [f"c{i}" for i in range(20)]
    assert {r["status"] for r in rows} == {"completed"}
    # Never more than the cap running, sampled; and in parallel: the cap was reached, by
    # each child's hold (claimed to finished). The holds cannot bound it from above: a
    # run's started_at is its claim transaction's start, and a claim that began before a
    # sibling's finish committed (and counted after it) seems to overlap it.
    spans = [(r["started_at"].timestamp(), r["finished_at"].timestamp()) for r in rows]
    assert max(seen) <= 5, seen
    assert most_at_once(spans) >= 5, sorted(spans)

    log = await api.steps(parent_id)
    assert_log_well_formed(log)
    (started,) = [s for s in log if s.kind == "tool_started"]
    (result,) = [s for s in log if s.kind == "tool_result"]
    assert result.ref_seq == started.seq and result.payload["status"] == "ok"
    outcomes = result.payload["output"]["children"]
    assert [o["child_run_id"] for o in outcomes] == [str(r["run_id"]) for r in rows]
    assert [o["output"] for o in outcomes] == [r["output"] for r in rows]
    assert all(f"c{i}" in o["output"] for i, o in enumerate(outcomes))
    # GetRun names a child's parent, the call, its place in the list and its close policy.
    kid = await api.get(str(rows[3]["run_id"]))
    assert (kid.parent_run_id, kid.parent_seq) == (parent_id, started.seq)
    assert (kid.parent_index, kid.parent_close) == (3, "cancel")
    assert list((await api.get(parent_id)).child_run_ids) == [str(r["run_id"]) for r in rows]
    # Parked once, woken once: one park, and the model asked twice (the fan-out, the answer).
    assert [s.kind for s in log].count("park") == 1
    assert [s.kind for s in log].count("model_decision") == 2
    assert "Children done" in parent.output


async def test_first_wakes_the_parent_once_and_cancels_the_rest(stack, executor_factory):
    cp, api, db = stack
    await api.publish("quick", "echo_input", ["echo"])
    await api.publish("slowpoke", "slow_worker", ["echo"])
    await api.publish("parent", "fan_first", ["start_children"])
    parent_id = await api.start("parent", "go")
    executor_factory(cp)

    (parent,) = await api.wait_terminal([parent_id], within=60)
    assert parent.status == run_pb2.RUN_STATUS_COMPLETED, parent.error
    log = await api.steps(parent_id)
    (result,) = [s for s in log if s.kind == "tool_result"]
    out = result.payload["output"]
    assert (out["wait"], out["ended"]) == ("first", 1)
    assert [c["status"] for c in out["children"]] == ["completed", "cancelled", "cancelled"]
    assert [s.kind for s in log].count("park") == 1
    slow = await db.fetch(
        "SELECT status, error FROM runs WHERE workspace_id = 'ws' AND agent_id = 'slowpoke'"
    )
    assert [(r["status"], r["error"]) for r in slow] == [
        ("cancelled", "not waited for: the parent went on")
    ] * 2


async def test_cancelling_the_parent_cancels_the_twenty_and_fences_their_holders(
    stack, executor_factory, pool
):
    cp, api, db = stack
    await publish_capped(api, "kid", "slow_worker", ["echo"], cap=5)
    parent_id = await api.start("parent", "go")
    (executor,) = executor_factory(cp, AGENTRUN_CAPACITY=8)
    await eventually(lambda: held_five(db), timeout=30, message="five children never ran")
    holders = await db.fetch(
        "SELECT run_id, lease_epoch FROM runs WHERE workspace_id = 'ws' AND agent_id = 'kid'"
        " AND status = 'running'"
    )

    await api.runs.CancelRun(run_pb2.CancelRunRequest(workspace_id=api.ws, run_id=parent_id))

    rows = await db.fetch(
        "SELECT run_id, status, error FROM runs WHERE workspace_id = 'ws' AND agent_id = 'kid'"
    )
    assert len(rows) == 20
    assert {(r["status"], r["error"]) for r in rows} == {("cancelled", "parent run cancelled")}
    # A holder's commit afterwards is refused: the run is no longer running at its epoch.
    for h in holders:
        late = steps.CommitRequest(
            "ws", h["run_id"], h["lease_epoch"], [steps.NewStep(99, "park", None, "{}")]
        )
        with pytest.raises(Fenced):
            await pipeline(pool).commit(late, 30)
    # Each holder stopped the run; told at once, as CancelRun tells the run's own holder
    # (a commit of its in flight at that moment may be refused first: fenced either way).
    for h in holders:
        await eventually(
            lambda h=h: f"run {h['run_id']} fenced" in executor.log_tail(4000),
            timeout=10,
            message=f"holder of {h['run_id']} never stopped",
        )
    told = [
        h
        for h in holders
        if f"run {h['run_id']} fenced: cancelled by the control plane" in executor.log_tail(4000)
    ]
    assert told, "no holder was told of the cancel"
    # ...and wrote nothing after the cancel's finish step, then or later.
    await asyncio.sleep(1.5)
    for r in rows:
        log = await api.steps(str(r["run_id"]))
        assert_log_well_formed(log)
        assert log[-1].kind == "finish" and log[-1].payload["status"] == "cancelled"


async def held_five(db: asyncpg.Connection) -> bool:
    return await running_kids(db) == 5


async def test_three_start_child_calls_of_one_decision_run_at_once_and_wake_the_parent_once(
    stack, executor_factory
):
    cp, api, db = stack
    await api.publish("kid", "fan_kid", ["echo"])
    await api.publish("parent", "parent3_at_once", ["start_child"])
    parent_id = await api.start("parent", "go")
    executor_factory(cp)

    (parent,) = await api.wait_terminal([parent_id], within=60)
    assert parent.status == run_pb2.RUN_STATUS_COMPLETED, parent.error
    rows = await db.fetch(
        "SELECT run_id, parent_seq, input, status, output, started_at, finished_at"
        " FROM runs WHERE workspace_id = 'ws' AND parent_run_id = $1"
        " ORDER BY parent_seq",
        uuid.UUID(parent_id),
    )
    assert [r["input"] for r in rows] == ["one", "two", "three"]
    assert {r["status"] for r in rows} == {"completed"}
    spans = [(r["started_at"].timestamp(), r["finished_at"].timestamp()) for r in rows]
    assert most_at_once(spans) >= 2  # in parallel, not one after another
    log = await api.steps(parent_id)
    assert_log_well_formed(log)
    kinds = [s.kind for s in log]
    # One commit started the three calls and parked: started, started, started, park.
    first = kinds.index("tool_started")
    assert kinds[first : first + 4] == ["tool_started"] * 3 + ["park"]
    assert kinds.count("park") == 1 and kinds.count("model_decision") == 2
    started = [s for s in log if s.kind == "tool_started"]
    results = [s for s in log if s.kind == "tool_result"]
    assert [r["parent_seq"] for r in rows] == [s.seq for s in started]
    by_call = {r.ref_seq: r for r in results}
    assert sorted(by_call) == [s.seq for s in started] and len(results) == 3
    kid = await api.get(str(rows[0]["run_id"]))
    assert not kid.HasField("parent_index") and kid.parent_close == "cancel"
    for row in rows:
        got = by_call[row["parent_seq"]].payload
        assert got["status"] == "ok" and got["output"]["child_run_id"] == str(row["run_id"])
        assert got["output"]["output"] == row["output"]
