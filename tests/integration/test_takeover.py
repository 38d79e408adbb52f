"""Fast takeover without weakening fencing, with real processes and a real lease (30 s).

* A black-holed (half-open) executor stream is noticed by both sides within 5 s, nothing
  is assigned into it after that, its runs move to another executor within seconds, and
  it reconnects after the heal; no stale write, no repeated effect.
* kill -9 and SIGSTOP under load: the victims' runs are claimed again within seconds of
  the fault, not after the 30 s lease: after kill -9 p50 <= 3 s, p99 <= 10 s; after a
  SIGSTOP (noticed once silent for 3 s) claimable again p50 <= 4 s, claimed p99 <= 10 s.
  A taken-over run that waits for a free slot goes first: no run of the load starts
  between its release and its claim. No stale write, no repeated effect.

Sizes are scaled for the suite and can be raised: AGENTRUN_TEST_BLACKHOLE_SECONDS (how
long the partition lasts, and at least until the takeover is seen; default 6 s, past
detection (3 s) and takeover (~3.5 s); the issue's scenario is 45 s), and
AGENTRUN_TEST_TAKEOVER_FAULTS (a kill -9, then a SIGSTOP, and so on; default 2).
The `chaos` version runs more faults at the issue's rate (a fault every 2-5 s).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import time
from dataclasses import dataclass
from datetime import datetime

import pytest

from agentrun.v1 import run_pb2
from tests.harness.agentrun_api import Api, clear_faults, sandbox_effects, set_fault
from tests.harness.invariants import assert_effects_at_most_once
from tests.harness.processes import ManagedProcess
from tests.harness.tcp_proxy import TcpProxy
from tests.harness.waiting import eventually
from tests.integration.test_durability import WRITER_TOOLS, check_run

LEASE = {"AGENTRUN_LEASE_SECONDS": "30", "AGENTRUN_HEARTBEAT_SECONDS": "10"}
BLACKHOLE_SECONDS = float(os.environ.get("AGENTRUN_TEST_BLACKHOLE_SECONDS", "6"))
FAULTS = int(os.environ.get("AGENTRUN_TEST_TAKEOVER_FAULTS", "2"))
NOTICE_BOUND = 5.0
P50_BOUND, P99_BOUND = 3.0, 10.0
STOP_P50_BOUND = 3.0 + 1.0  # silent for AGENTRUN_STREAM_DEAD_SECONDS, then released


@pytest.fixture
async def stack(db_url, control_plane, sandbox_model, sandbox_providers):
    cp = control_plane(db_url, **LEASE)
    api = await Api.connect(cp.address, db_url)
    await api.publish("writer", "writer", WRITER_TOOLS)
    # Model calls take a while, so runs are held (mid-step) when the fault strikes.
    set_fault(sandbox_model.url, delay_ms=400)
    yield cp, api
    clear_faults(sandbox_model.url)
    await api.close()


def messages(process: ManagedProcess) -> list[str]:
    """The `message` of every JSON log line the process wrote."""
    found = []
    for line in process.log_path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                found.append(str(json.loads(line).get("message", "")))
            except ValueError:
                continue
    return found


def logged(process: ManagedProcess, text: str) -> int:
    return sum(text in message for message in messages(process))


async def holders(db, run_ids: list[str]) -> dict[str, tuple[str, int, int]]:
    """run id -> (lease owner, epoch, attempt) of the running ones."""
    rows = await db.fetch(
        "SELECT run_id::text, lease_owner, lease_epoch, attempt FROM runs "
        "WHERE run_id = ANY($1::uuid[]) AND status = 'running'",
        run_ids,
    )
    return {r["run_id"]: (r["lease_owner"], r["lease_epoch"], r["attempt"]) for r in rows}


async def check_all(api, run_ids, sandbox_model, sandbox_providers) -> None:
    """Every run completed; no stale write (epochs never go back in a log), no re-asked
    decision, no write sent twice, no effect twice at the mail provider."""
    runs = await api.wait_terminal(run_ids, within=90)
    assert {r.status for r in runs} == {run_pb2.RUN_STATUS_COMPLETED}, [r.error for r in runs]
    for run_id in run_ids:
        await check_run(api, run_id, sandbox_model, sandbox_providers)
    mail = [
        e
        for e in sandbox_effects(sandbox_providers.url, "mail")
        if any((e["key"] or "").startswith(r) for r in run_ids)
    ]
    assert_effects_at_most_once(mail, "mail")


async def test_a_black_holed_stream_is_noticed_both_ways_and_its_runs_move_on(
    stack, executor_factory, sandbox_model, sandbox_providers, db
):
    cp, api = stack
    proxy = await TcpProxy(cp.address).start()
    try:
        (cut,) = executor_factory(cp, AGENTRUN_CONTROL_PLANE=proxy.address, AGENTRUN_CAPACITY=2)
        (other,) = executor_factory(cp, AGENTRUN_CAPACITY=4)
        for proc in (cut, other):
            await eventually(
                lambda proc=proc: logged(proc, "connected to control plane"),
                timeout=30,
                message=f"{proc.name} never connected",
            )
        set_fault(sandbox_model.url, delay_ms=1000)  # runs held for seconds
        all_ids = [await api.start("writer", f"lead {i}") for i in range(4)]

        async def cut_holds() -> dict[str, int]:
            held = await holders(db, all_ids)
            return {r: h[1] for r, h in held.items() if h[0] == "executor-1"}

        epochs = await eventually(cut_holds, timeout=30, message="executor-1 never held a run")
        run_ids = list(epochs)
        opened = time.monotonic()
        proxy.black_hole()
        await eventually(
            lambda: logged(cut, "control plane stream silent"),
            timeout=10,
            message="the executor never noticed the silent stream",
        )
        executor_noticed = time.monotonic() - opened
        await eventually(
            lambda: logged(cp.process, "declared dead"),
            timeout=10,
            message="the control plane never noticed the silent stream",
        )
        control_noticed = time.monotonic() - opened

        async def taken_over() -> bool:
            held = await holders(db, run_ids)
            return all(
                held.get(r, ("", 0, 0))[0] == "executor-2" and held[r][1] > epochs[r]
                for r in run_ids
            )

        # Runs started after the control plane noticed go to the live executor on their first
        # claim: nothing was claimed for (or assigned into) the dead stream.
        late = [await api.start("writer", "late lead")]
        await eventually(taken_over, timeout=15, message="the runs were not taken over")
        took = time.monotonic() - opened
        print(
            f"black hole: executor noticed in {executor_noticed:.2f}s, control plane in "
            f"{control_noticed:.2f}s, runs taken over in {took:.2f}s"
        )
        assert executor_noticed <= NOTICE_BOUND
        assert control_noticed <= NOTICE_BOUND
        assert took <= P99_BOUND

        # The partition lasts its whole length, then heals (a scenario's length, not a wait).
        await asyncio.sleep(max(0.0, BLACKHOLE_SECONDS - (time.monotonic() - opened)))
        proxy.heal()
        await eventually(
            lambda: logged(cut, "connected to control plane") >= 2,
            timeout=20,
            message="the cut executor never reconnected after the heal",
        )
        await check_all(api, all_ids + late, sandbox_model, sandbox_providers)
        for run_id in late:
            run = await api.get(run_id)
            assert run.attempt == 0, f"late run {run_id} was claimed for the dead stream"
            assert {s.epoch for s in await api.steps(run_id) if s.epoch} == {run.lease_epoch}
        assert cut.alive
    finally:
        await proxy.close()


@dataclass
class Takeover:
    """One struck run taken over: seconds from the fault until it was claimable again and
    until it was claimed, and how many runs were started meanwhile (0: it went first)."""

    claimable: float
    claimed: float
    started_ahead: int


async def _fault_and_measure(db, run_ids, fleet, spawn, stop: bool) -> list[Takeover]:
    """Strike one executor that holds runs (kill -9, or SIGSTOP) and follow its runs until
    each is claimed again (or a commit in flight at the fault finished or parked it first:
    no takeover to measure). Times are the database's clock: held_since of the new claim,
    and the first poll that saw it claimable (the release on break moves wake_at from the
    lease's expiry to the horizon's end, which then passes)."""

    async def victim() -> tuple[ManagedProcess, dict[str, tuple[str, int, int]]] | None:
        held = await holders(db, run_ids)
        for proc in fleet:
            name = proc.name
            mine = {r: h for r, h in held.items() if h[0] == name}
            if proc.alive and mine:
                return proc, mine
        return None

    proc, mine = await eventually(victim, timeout=30, message="no live executor holds a run")
    struck = await db.fetchval("SELECT now()")
    proc.stop() if stop else proc.kill()
    fleet.append(spawn())
    released: datetime | None = None

    async def settled():
        nonlocal released
        rows = await db.fetch(
            "SELECT run_id::text, lease_epoch, attempt, held_since, status, now() AS now, "
            "wake_at <= now() AS released "
            "FROM runs WHERE run_id = ANY($1::uuid[])",
            list(mine),
        )
        pending = [
            r for r in rows if r["lease_epoch"] == mine[r["run_id"]][1] and r["status"] == "running"
        ]
        if released is None and any(r["released"] for r in pending):
            released = pending[0]["now"]
        return None if pending else rows

    rows = await eventually(settled, timeout=40, message=f"{sorted(mine)} never claimed again")
    if stop:
        proc.cont()
    taken = []
    for row in rows:
        _, epoch, attempt = mine[row["run_id"]]
        if row["lease_epoch"] > epoch and row["attempt"] == attempt + 1:  # a takeover
            # Claimable by the first poll that saw it, or at the latest when claimed.
            claimable = min(released or row["held_since"], row["held_since"])
            ahead = await db.fetchval(
                "SELECT count(*) FROM runs WHERE run_id = ANY($1::uuid[]) "
                "AND started_at > $2 AND started_at < $3",
                run_ids,
                claimable,
                row["held_since"],
            )
            taken.append(
                Takeover(
                    (claimable - struck).total_seconds(),
                    (row["held_since"] - struck).total_seconds(),
                    ahead,
                )
            )
    return taken


def _percentiles(latencies: list[float]) -> tuple[float, float]:
    ordered = sorted(latencies)
    return statistics.median(ordered), ordered[round(0.99 * (len(ordered) - 1))]


async def _takeover_under_faults(
    stack,
    executor_factory,
    sandbox_model,
    sandbox_providers,
    db,
    faults: int,
    runs: int,
    pause: tuple[float, float],
) -> None:
    cp, api = stack
    run_ids = [await api.start("writer", f"lead {i}") for i in range(runs)]
    fleet = list(executor_factory(cp, count=3, AGENTRUN_CAPACITY=2))

    def spawn() -> ManagedProcess:
        return executor_factory(cp, AGENTRUN_CAPACITY=2)[0]

    taken: dict[str, list[Takeover]] = {"kill -9": [], "SIGSTOP": []}
    rng = random.Random(7)
    n = 0
    # `faults` strikes, and more (a few at most) until each kind has caught a run mid-hold:
    # a strike can find its runs' commit already landed (parked in a sleep, finished).
    while n < faults or (not all(taken.values()) and n < faults + 6):
        if not await db.fetchval(
            "SELECT count(*) FROM runs WHERE run_id = ANY($1::uuid[]) "
            "AND status NOT IN ('completed', 'failed', 'cancelled')",
            run_ids,
        ):
            break  # every run is done: nothing left to strike
        # Every third fault (the second first) is a SIGSTOP: a paused holder, taken over
        # early, woken later.
        stop = n % 3 == 1
        taken["SIGSTOP" if stop else "kill -9"] += await _fault_and_measure(
            db, run_ids, fleet, spawn, stop=stop
        )
        n += 1
        await asyncio.sleep(rng.uniform(*pause))  # the fault schedule, not a synchronisation
    await check_all(api, run_ids, sandbox_model, sandbox_providers)
    for kind, runs_taken in taken.items():
        assert runs_taken, f"no {kind} caught a run mid-hold in {n} faults: nothing measured"
        p50, p99 = _percentiles([t.claimed for t in runs_taken])
        free_p50, _ = _percentiles([t.claimable for t in runs_taken])
        print(
            f"takeover after {kind} (lease 30 s): n={len(runs_taken)} p50={p50:.2f}s "
            f"p99={p99:.2f}s max={max(t.claimed for t in runs_taken):.2f}s; claimable "
            f"p50={free_p50:.2f}s"
        )
        # Whenever a taken-over run waited for a free slot, it went first: no run of the
        # load was started between its release and its claim (lapsed leases come first).
        assert [t.started_ahead for t in runs_taken] == [0] * len(runs_taken), runs_taken
    # A killed executor's stream breaks at once: its runs are claimable at its last Ping
    # + horizon + margin (<= 2 s), and the issue bounds its takeover (p50 <= 3 s).
    kill_p50, kill_p99 = _percentiles([t.claimed for t in taken["kill -9"]])
    assert kill_p50 <= P50_BOUND and kill_p99 <= P99_BOUND
    # A paused one's stream stays open until it has been silent for 3 s
    # (AGENTRUN_STREAM_DEAD_SECONDS); its runs are claimable then, and claimed by the next
    # free slot: with spare slots, at once; with the fleet saturated (the chaos version:
    # 80 runs on 6 slots), when a run ends somewhere, which no takeover can hasten.
    stop_free_p50, _ = _percentiles([t.claimable for t in taken["SIGSTOP"]])
    _, stop_p99 = _percentiles([t.claimed for t in taken["SIGSTOP"]])
    assert stop_free_p50 <= STOP_P50_BOUND and stop_p99 <= P99_BOUND
    stopped = [p for p in fleet if p.alive]
    assert stopped, "every executor died"


async def test_kill_and_stop_take_over_within_seconds_not_the_lease(
    stack, executor_factory, sandbox_model, sandbox_providers, db
):
    await _takeover_under_faults(
        stack,
        executor_factory,
        sandbox_model,
        sandbox_providers,
        db,
        faults=FAULTS,
        runs=6,
        pause=(0.5, 1.0),
    )


@pytest.mark.chaos
async def test_takeover_latency_under_the_fault_suites_load(
    stack, executor_factory, sandbox_model, sandbox_providers, db
):
    faults = int(os.environ.get("AGENTRUN_CHAOS_TAKEOVER_FAULTS", "20"))
    set_fault(sandbox_model.url, delay_ms=1000)  # enough work to outlast the faults
    await _takeover_under_faults(
        stack,
        executor_factory,
        sandbox_model,
        sandbox_providers,
        db,
        faults=faults,
        runs=80,
        pause=(2.0, 5.0),
    )
