"""Caps hold with concurrent claimers: never one run over, checked continuously while they race.

Six claimers, each on its own connection, claim batches of random size and hold each run
for a few milliseconds; then they complete it, park it, or forget it (its lease lapses
and another claimer takes it over). Meanwhile runs keep being admitted and cancelled. A
monitor reads, in one snapshot at a time and as often as it can, how many runs of every
workspace and agent are running: never more than the cap, always what the counters say.
That every run ends also shows the claim never lost a workspace with due runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections import defaultdict

import asyncpg
import pytest

from control_plane.store import lease, runs, steps, workspaces
from control_plane.store.errors import Fenced
from tests import factories
from tests.harness.waiting import eventually

# workspace -> (plan, cap given for enterprise)
PLANS = {
    "free-a": ("free", None),
    "free-b": ("free", None),
    "team": ("enterprise", 5),
    "big": ("enterprise", 7),
}
AGENT_CAPS = {("team", "capped"): 1, ("big", "capped"): 2}
RUNS_PER_AGENT = 40
ADMITTED_LATER = 160
LEASE_SECONDS = 0.4
CLAIMERS = 6

COUNTS = """
SELECT 'workspace ' || w.workspace_id AS who, w.max_concurrency AS cap, (SELECT coalesce(sum(c.n), 0) FROM workspace_running_counts c
        WHERE c.workspace_id = w.workspace_id) AS running,
       (SELECT count(*) FROM runs r
        WHERE r.workspace_id = w.workspace_id AND r.status = 'running') AS actual
FROM workspaces w
UNION ALL
SELECT 'agent ' || a.workspace_id || '/' || a.agent_id, a.max_concurrency, (SELECT coalesce(sum(c.n), 0) FROM agent_running_counts c
        WHERE c.workspace_id = a.workspace_id AND c.agent_id = a.agent_id) AS running,
       (SELECT count(*) FROM runs r WHERE r.workspace_id = a.workspace_id
        AND r.agent_id = a.agent_id AND r.status = 'running')
FROM agents a
"""
LEFT = "SELECT count(*) FROM runs WHERE status IN ('queued', 'running', 'waiting')"


@pytest.fixture
async def pool(db_url):
    p = await asyncpg.create_pool(db_url, min_size=4, max_size=CLAIMERS + 6)
    yield p
    await p.close()


class Race:
    """Shared state of the race: the rng, the end flag, what the monitor saw."""

    def __init__(self, pool: asyncpg.pool.Pool) -> None:
        self.pool = pool
        self.rng = random.Random(6)
        self.done = asyncio.Event()
        self.admitting = True
        self.checks = 0
        self.peak: dict[str, int] = defaultdict(int)
        self.tasks: set[asyncio.Task[None]] = set()

    async def monitor(self) -> None:
        async with self.pool.acquire() as conn:
            while not self.done.is_set():
                for row in await conn.fetch(COUNTS):
                    assert row["running"] == row["actual"], f"{row['who']}: counter drifted"
                    if row["cap"] is not None:
                        assert row["actual"] <= row["cap"], f"{row['who']} over its cap: {row}"
                    self.peak[row["who"]] = max(self.peak[row["who"]], row["actual"])
                self.checks += 1

    async def claimer(self, name: str) -> None:
        async with self.pool.acquire() as conn:
            while not self.done.is_set():
                batch = self.rng.randint(1, 6)
                held = await lease.claim_due(conn, [name] * batch, LEASE_SECONDS)
                for row in held:
                    self._spawn(self.work(row))
                if not held:
                    await asyncio.sleep(0.005)  # polling, like the dispatcher between pokes

    async def work(self, row: runs.Run) -> None:
        """Hold the run a moment, then complete it, park it, or forget it."""
        await asyncio.sleep(self.rng.uniform(0, 0.02))
        roll = self.rng.random()
        if roll < 0.05:
            return  # forgotten: the lease lapses and another claimer takes it over
        seq = row.step_count
        if roll < 0.3:
            wake = self.rng.uniform(0, 0.03)
            transition = steps.Transition("waiting", wait_reason="sleep", wake_after_seconds=wake)
        else:
            transition = steps.Transition("completed", text="done")
        step = steps.NewStep(seq, "model_decision", None, json.dumps({"content": "x"}))
        req = steps.CommitRequest(row.workspace_id, row.run_id, row.lease_epoch, [step], transition)
        with contextlib.suppress(Fenced):  # cancelled, or taken over after a slow hold
            await steps.commit(self.pool, req, LEASE_SECONDS)

    async def admitter(self) -> None:
        for i in range(ADMITTED_LATER):
            ws = self.rng.choice(list(PLANS))
            agent = self.rng.choice(["capped", "open"])
            await _admit(self.pool, ws, agent, f"late {i}")
            await asyncio.sleep(self.rng.uniform(0, 0.01))
        self.admitting = False

    async def canceller(self) -> None:
        while not self.done.is_set():
            run_id = await self.pool.fetchval(
                "SELECT run_id FROM runs WHERE status IN ('queued', 'running', 'waiting') "
                "ORDER BY random() LIMIT 1"
            )
            if run_id is not None:
                ws = await self.pool.fetchval(
                    "SELECT workspace_id FROM runs WHERE run_id = $1", run_id
                )
                await runs.cancel_run(self.pool, ws, run_id, "changed my mind")
            await asyncio.sleep(0.05)

    async def all_ended(self) -> bool:
        return not self.admitting and not await self.pool.fetchval(LEFT)

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


async def _admit(pool: asyncpg.pool.Pool, ws: str, agent: str, text: str) -> None:
    adm = runs.Admission(
        workspace_id=ws,
        agent_id=agent,
        agent_version=1,
        input=text,
        request_id=None,
        max_steps=50,
        max_tokens=100_000,
        max_tool_calls=100,
        deadline_seconds=3600,
    )
    await runs.insert_run(pool, adm)


async def _seed(pool: asyncpg.pool.Pool) -> None:
    for ws, (plan, cap) in PLANS.items():
        await workspaces.set_plan(pool, ws, plan, cap)
        for agent in ("capped", "open"):
            await factories.agent_version(pool, ws, agent)
            for i in range(RUNS_PER_AGENT):
                await _admit(pool, ws, agent, f"early {i}")
    for (ws, agent), cap in AGENT_CAPS.items():
        await workspaces.set_agent_cap(pool, ws, agent, cap)


async def test_caps_hold_under_concurrent_claimers(pool):
    await _seed(pool)
    race = Race(pool)
    monitor = asyncio.create_task(race.monitor())
    workers = [asyncio.create_task(race.claimer(f"claimer-{i}")) for i in range(CLAIMERS)]
    others = [asyncio.create_task(race.admitter()), asyncio.create_task(race.canceller())]
    try:
        await eventually(race.all_ended, timeout=120, interval=0.05, message="runs left over")
    finally:
        race.done.set()
        await asyncio.gather(*workers, *others, *race.tasks, return_exceptions=True)
    await monitor  # re-raises a cap the monitor caught exceeded

    assert race.checks > 100, "the monitor barely looked"
    # Every cap was reached, so the checks above tested something.
    for ws, (_, cap) in PLANS.items():
        assert race.peak[f"workspace {ws}"] == (cap or 2), ws
    for (ws, agent), cap in AGENT_CAPS.items():
        assert race.peak[f"agent {ws}/{agent}"] == cap
    statuses = dict(await pool.fetch("SELECT status, count(*) FROM runs GROUP BY status"))
    assert set(statuses) <= {"completed", "cancelled"}
    assert await pool.fetchval("SELECT max(attempt) FROM runs") >= 1, "no lease lapsed"
