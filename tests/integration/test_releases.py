"""Releases with real processes (issues 15 and 41).

Executors of release A hold runs; release B starts and takes the new runs; A is
drained (`agentrun releases drain A`): its executors claim nothing more, finish
what they hold and exit, and `agentrun releases wait-drained A` returns 0. Every
run's steps were written under one release only, as the executors' own logs
(`claimed run <id> … (epoch N …) on release R`, one line per assignment) and the
steps' own release show.

A run parked between turns waits on no release: drained under it, A leaves it to
B, which continues it when it wakes, with no operator. A turn in progress stays
on its release: forced, A hands one back mid-turn, and the run waits visibly
(GetRun's queue cause RELEASE_UNAVAILABLE, GetRelease's runs, `wait-drained`
exiting 1) until an executor of A returns and finishes the turn.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from itertools import pairwise

from agentrun.v1 import release_pb2, release_pb2_grpc, run_pb2
from tests.harness import auth
from tests.harness.agentrun_api import Api, clear_faults, set_fault
from tests.harness.cli import agentrun
from tests.harness.processes import ManagedProcess
from tests.harness.waiting import eventually
from tests.integration.test_console_http import signed_in

CLAIMED = re.compile(
    r"claimed run (\S+) of workspace \S+ \(epoch (\d+), .*\) on release ([^\s\"]+)"
)
WORKER = ("worker", "slow_worker", ["echo"])  # ten one-second model replies, ten echoes
DRAIN_SECONDS = 40  # `releases drain A --finish-within`
# "No run waits longer than the drain deadline plus a claim": a claim comes within the
# control plane's claim poll (0.5 s), and a wait is measured between commits, so it also
# holds the first model reply of the next hold (the slow worker's 1 s).
LONGEST_WAIT = DRAIN_SECONDS + 0.5 + 1.0


def cli(address: str, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    return agentrun(address, key, *args)


def release_of_claims(executors: list[ManagedProcess]) -> dict[tuple[str, int], str]:
    """(run id, epoch) -> the release of the executor each assignment was logged by."""
    found: dict[tuple[str, int], str] = {}
    for process in executors:
        for run_id, epoch, release in CLAIMED.findall(process.log_path.read_text()):
            assert found.setdefault((run_id, int(epoch)), release) == release
    return found


async def releases_of_steps(api: Api, run_id: str, claims: dict[tuple[str, int], str]) -> set[str]:
    """The releases of the executors that wrote the run's steps (input excluded)."""
    steps = [s for s in await api.steps(run_id) if s.epoch > 0]
    assert steps, f"run {run_id} has no executor step"
    return {claims[(run_id, s.epoch)] for s in steps}


async def longest_wait(api: Api, run_id: str) -> float:
    """The longest the run went between two of its steps: waiting for its first claim after
    its input, for its next holder after a hand-back, or for one of its holder's steps."""
    resp = await api.runs.ListRunSteps(
        run_pb2.ListRunStepsRequest(workspace_id=api.ws, run_id=run_id, page_size=1000)
    )
    times = [s.create_time.ToDatetime() for s in resp.steps]
    return max((later - earlier).total_seconds() for earlier, later in pairwise(times))


async def release(stub: release_pb2_grpc.ReleaseServiceStub, name: str) -> release_pb2.Release:
    return (await stub.GetRelease(release_pb2.GetReleaseRequest(name=name))).release


async def connected(stub: release_pb2_grpc.ReleaseServiceStub, name: str) -> bool:
    listed = await stub.ListReleases(release_pb2.ListReleasesRequest())
    return any(r.name == name and r.executors for r in listed.releases)


async def held_by(api: Api, run_ids: list[str], name: str) -> bool:
    runs = [await api.get(r) for r in run_ids]
    return all(r.status == run_pb2.RUN_STATUS_RUNNING and r.release == name for r in runs)


async def test_two_releases_side_by_side_a_drained_release_finishes_its_runs_and_exits(
    db_url, control_plane, executor_factory
):
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url, "acme")
    await api.publish(*WORKER)
    key = await auth.platform_key(db_url)
    channel = auth.channel(cp.address, key)
    stub = release_pb2_grpc.ReleaseServiceStub(channel)

    team_a = executor_factory(cp, count=2, AGENTRUN_RELEASE="A", AGENTRUN_CAPACITY=4)
    on_a = [await api.start("worker", f"a {n}") for n in range(4)]
    await eventually(lambda: held_by(api, on_a, "A"), timeout=30, message="A never held its runs")

    team_b = executor_factory(cp, count=1, AGENTRUN_RELEASE="B", AGENTRUN_CAPACITY=4)

    async def b_newest() -> bool:  # connected, and past its self-check canary (the gate)
        return await connected(stub, "B") and (await release(stub, "B")).newest

    await eventually(b_newest, timeout=30, message="B never took new runs")
    # New runs go to the newest release with executors, although A has free slots.
    on_b = [await api.start("worker", f"b {n}") for n in range(3)]
    await eventually(lambda: held_by(api, on_b, "B"), timeout=30, message="B never took new runs")

    drain = await asyncio.to_thread(
        cli, cp.address, key, "releases", "drain", "A", "--finish-within", str(DRAIN_SECONDS)
    )
    assert drain.returncode == 0, drain.stderr
    held = re.search(r"held=(\d+)", drain.stdout)
    assert held and int(held.group(1)) > 0, drain.stdout  # A was holding runs when told
    waited = await asyncio.to_thread(
        cli, cp.address, key, "releases", "wait-drained", "A", "--timeout", "45"
    )
    assert waited.returncode == 0, waited.stdout + waited.stderr
    # A's executors exited on their own after their last run.
    for process in team_a:
        assert await asyncio.to_thread(process.wait, 30) == 0
    done = await api.wait_terminal(on_a + on_b, within=40)
    assert {r.status for r in done} == {run_pb2.RUN_STATUS_COMPLETED}
    assert {r.run_id: r.release for r in done} == {
        **dict.fromkeys(on_a, "A"),
        **dict.fromkeys(on_b, "B"),
    }

    # Every run's steps carry one release only: its own.
    claims = release_of_claims(team_a + team_b)
    for run in done:
        assert await releases_of_steps(api, run.run_id, claims) == {run.release}
    # No run waited longer than the drain deadline plus a claim.
    waits = {run.run_id: await longest_wait(api, run.run_id) for run in done}
    print(f"longest wait of a run: {max(waits.values()):.2f}s (bound {LONGEST_WAIT}s)")
    assert max(waits.values()) <= LONGEST_WAIT, waits
    a = await release(stub, "A")
    assert a.drained and not a.executors and a.runs_held == 0
    assert (await release(stub, "B")).newest
    listed = await asyncio.to_thread(cli, cp.address, key, "releases", "list")
    states = {line.split()[0]: line.split()[1] for line in listed.stdout.splitlines()}
    assert states == {"A": "drained", "B": "newest"}, listed.stdout
    await api.close()
    await channel.close()


async def logged_steps(api: Api, run_id: str) -> list[run_pb2.Step]:
    resp = await api.runs.ListRunSteps(
        run_pb2.ListRunStepsRequest(workspace_id=api.ws, run_id=run_id, page_size=1000)
    )
    return list(resp.steps)


async def test_a_run_sleeping_on_a_drained_release_wakes_on_the_new_one_with_no_operator(
    db_url, control_plane, executor_factory
):
    """A park between turns leaves the run on no release: A is drained while the run
    sleeps, and when the sleep ends B's executors take it within a claim; the steps after
    the park carry B, those before it A; `wait-drained A` is done at once."""
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url, "acme")
    await api.publish("sleeper", "deploy_sleep", ["sleep", "echo"])
    key = await auth.platform_key(db_url)
    channel = auth.channel(cp.address, key)
    stub = release_pb2_grpc.ReleaseServiceStub(channel)

    (a,) = executor_factory(cp, AGENTRUN_RELEASE="A")
    run_id = await api.start("sleeper", "sleep through a deploy")

    async def parked() -> run_pb2.Run | None:
        run = await api.get(run_id)
        return run if run.status == run_pb2.RUN_STATUS_WAITING else None

    asleep = await eventually(parked, timeout=30, message="the run never parked")
    assert asleep.release == "", asleep  # waiting between turns: on no release
    (b,) = executor_factory(cp, AGENTRUN_RELEASE="B")
    await eventually(lambda: connected(stub, "B"), timeout=30, message="B never connected")
    drain = await asyncio.to_thread(cli, cp.address, key, "releases", "drain", "A")
    assert drain.returncode == 0, drain.stderr
    assert await asyncio.to_thread(a.wait, 30) == 0  # it held nothing: it exits at once
    waited = await asyncio.to_thread(
        cli, cp.address, key, "releases", "wait-drained", "A", "--timeout", "20"
    )
    assert waited.returncode == 0, waited.stdout + waited.stderr

    (done,) = await api.wait_terminal([run_id], within=40)
    assert done.status == run_pb2.RUN_STATUS_COMPLETED and done.release == "B", done
    steps = await logged_steps(api, run_id)
    (park,) = [s for s in steps if s.kind == run_pb2.STEP_KIND_PARK]
    before = {s.release for s in steps if 0 < s.seq < park.seq and s.epoch}
    after = {s.release for s in steps if s.seq > park.seq and s.epoch}
    assert before == {"A"} and park.release == "A" and after == {"B"}, steps
    # Within one claim of waking: the first step after the park came right after its end.
    woke = park.create_time.ToDatetime().timestamp() + 8.0
    first_after = min(s.create_time.ToDatetime().timestamp() for s in steps if s.seq > park.seq)
    print(f"first step on B {first_after - woke:.2f}s after the sleep ended")
    assert first_after - woke < 3.0
    assert b.alive
    await api.close()
    await channel.close()


async def test_a_forced_drain_leaves_a_turn_in_progress_on_its_release_until_one_returns(
    db_url, control_plane, executor_factory, sandbox_providers
):
    """Forced, A hands back a turn in progress (one echo done, the second to start): the
    run waits on A, visibly (GetRun's cause, GetRelease's runs, `wait-drained` exits 1
    naming it) while B serves; an executor of A coming back finishes the turn on A (and,
    told to drain once no run waits for A, hands the run on at the turn's end)."""
    cp = control_plane(db_url)
    api = await Api.connect(cp.address, db_url, "acme")
    await api.publish("twice", "two_echoes", ["echo"])
    key = await auth.platform_key(db_url)
    channel = auth.channel(cp.address, key)
    stub = release_pb2_grpc.ReleaseServiceStub(channel)
    # The first call takes 4.5 s: long enough to force the drain while it is out, short
    # enough to return within the forced drain's grace (executor/worker.py FORCED_GRACE).
    set_fault(sandbox_providers.url, provider="echo", mode="delay", delay_ms=4500, count=1)
    try:
        (a,) = executor_factory(cp, AGENTRUN_RELEASE="A")
        run_id = await api.start("twice", "a turn of two calls")

        async def first_call_out() -> bool:
            return any(s.kind == "tool_started" for s in await api.steps(run_id))

        await eventually(first_call_out, timeout=30, message="the first call never started")
    finally:
        clear_faults(sandbox_providers.url)
    (b,) = executor_factory(cp, AGENTRUN_RELEASE="B")
    await eventually(lambda: connected(stub, "B"), timeout=30, message="B never connected")
    forced = await asyncio.to_thread(cli, cp.address, key, "releases", "drain", "A", "--force")
    assert forced.returncode == 0, forced.stderr
    assert await asyncio.to_thread(a.wait, 30) == 0

    left = await api.get(run_id)
    assert left.status == run_pb2.RUN_STATUS_WAITING and left.release == "A", left
    resp = await api.runs.GetRun(run_pb2.GetRunRequest(workspace_id="acme", run_id=run_id))
    assert resp.run.queue.cause == run_pb2.QUEUE_WAIT_CAUSE_RELEASE_UNAVAILABLE
    shown = await release(stub, "A")
    assert shown.runs_waiting == 1 and not shown.drained
    assert [(r.run_id, r.wait_reason) for r in shown.runs] == [(run_id, "handoff")]
    waited = await asyncio.to_thread(
        cli, cp.address, key, "releases", "wait-drained", "A", "--timeout", "2"
    )
    assert waited.returncode == 1 and run_id in waited.stderr, waited.stderr
    # The workspace's console lists it under "Waiting for a release", with A.
    ws_key = await auth.workspace_key(db_url, "acme", role="admin")
    async with signed_in(cp.http_url, ws_key) as console:
        page = await console.get("/console/queue")
    assert page.status_code == 200
    assert page.text.count('id="release-waits"') == 1  # one table, in the page's body
    waits = page.text[page.text.index('id="release-waits"') :]
    assert run_id in waits and ">A<" in waits, waits
    # B serves other runs meanwhile, and leaves this one alone.
    (other,) = await api.wait_terminal([await api.start("twice", "new work")], within=30)
    assert other.release == "B"
    assert (await api.get(run_id)).release == "A"

    (back,) = executor_factory(cp, AGENTRUN_RELEASE="A")
    (done,) = await api.wait_terminal([run_id], within=40)
    # The turn in progress finished on A; what came after it (the model's answer) may have
    # run on B, once the returning executor of A was told to drain in its turn.
    assert done.status == run_pb2.RUN_STATUS_COMPLETED, done
    steps = await logged_steps(api, run_id)
    decision = min(s.seq for s in steps if s.kind == run_pb2.STEP_KIND_MODEL_DECISION)
    (answer,) = [s for s in steps if s.kind == run_pb2.STEP_KIND_FINISH]
    turn = {s.release for s in steps if decision <= s.seq < answer.seq and s.epoch}
    assert turn == {"A"}, steps  # the turn ran on A only, across the hand-back
    assert back.alive and b.alive
    await api.close()
    await channel.close()
