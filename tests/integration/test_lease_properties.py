"""The lease state machine under random sequences of operations (hypothesis, real Postgres).

Three executors claim, heartbeat, commit, park (on a sleep, an approval, a person's
decision on an unknown outcome), finish, hand back and retry; runs are admitted,
cancelled and woken by decisions; caps change; the database clock moves (past the lease,
so leases lapse and are taken over) and is sometimes read a little behind. Every call
goes through the store with an explicit `now`, so the database's view of time is the
test's clock, and a Python model predicts what each call must do.

After every operation the database must equal the model (runs, leases, wake times,
steps), and: at most one live holder per run; epochs only grow (+1 per claim); every
write from a stale epoch was refused and changed nothing; running counters equal a
COUNT(*) and a claim never takes a run over a workspace's or an agent's cap; unique,
gapless seqs whose epochs never decrease; next_wake_at a lower bound of what is due and of
every lease's end (a lapsed lease is taken over at its workspace's turn, 0047).

No rule has a precondition: which run a claim takes among equals is the database's
choice, so the state may differ between two replays of one sequence, and hypothesis
needs the rules it may pick not to depend on it (a rule with nothing to do does nothing).

LEASE_PROPERTY_EXAMPLES (default 250) and LEASE_PROPERTY_STEPS (default 40) size the run.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import threading
import uuid
from collections import Counter
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from control_plane.store import approvals, lease, runs, steps, unknowns, workspaces
from control_plane.store.errors import Fenced
from tests import factories
from tests.harness.commits import commit_with_approval

EXAMPLES = int(os.environ.get("LEASE_PROPERTY_EXAMPLES", "250"))
STEPS = int(os.environ.get("LEASE_PROPERTY_STEPS", "40"))
# ~10 ms a step on two shared cores, and room for hypothesis to shrink a failure.
TIMEOUT = 300 + EXAMPLES * STEPS // 50
LEASE = 30
EXECUTORS = ("ex-0", "ex-1", "ex-2")
WORKSPACES = ("wa", "wb")
AGENTS = ("x", "y")
BASE = datetime(2031, 1, 1, tzinfo=UTC)  # far from the real clock: a stray now() shows
LIVE = ("queued", "running", "waiting")

# What the sequences must have reached between them (each any of its events). A lazy
# commit's two outcomes are one group: which of them a run draws varies (CI drew no
# "kept", another run no "kept_renewed"); test_commit_renewal.py pins both, at the boundary.
EXERCISED = (
    ("claim",),
    ("takeover",),
    ("renewed",),
    ("beat_refused", "stale_beat"),
    ("commit_refused", "stale_commit", "stale_finish"),
    ("stale_collide",),
    ("duplicate",),
    ("renew",),
    ("kept", "kept_renewed"),
    ("sleep", "until"),
    ("approval_woke_True", "unknown_woke_True"),
    ("completed", "failed"),
    ("handed_back",),
    ("cancel_running",),
)
RESET = """
DELETE FROM approval_tokens; DELETE FROM outbox; DELETE FROM approvals;
DELETE FROM steps; DELETE FROM runs;
UPDATE workspace_turns SET last_served_at = '-infinity', next_wake_at = NULL;
"""
RUNS = """SELECT run_id, status, wait_reason, wake_at, lease_owner, lease_epoch, attempt,
                 started_at, finished_at FROM runs"""
STEP_LOG = "SELECT run_id, seq, epoch, kind FROM steps ORDER BY run_id, seq"
COUNTS = """
SELECT w.workspace_id, NULL AS agent_id, w.max_concurrency AS cap, (SELECT coalesce(sum(c.n), 0) FROM workspace_running_counts c
        WHERE c.workspace_id = w.workspace_id) AS running,
       (SELECT count(*) FROM runs r
        WHERE r.workspace_id = w.workspace_id AND r.status = 'running') AS actual,
       (SELECT t.next_wake_at FROM workspace_turns t WHERE t.workspace_id = w.workspace_id) AS bound,
       (SELECT min(r.wake_at) FROM runs r WHERE r.workspace_id = w.workspace_id
        AND r.status IN ('queued', 'waiting', 'running')) AS earliest
FROM workspaces w
UNION ALL
SELECT a.workspace_id, a.agent_id, a.max_concurrency, (SELECT coalesce(sum(c.n), 0) FROM agent_running_counts c
        WHERE c.workspace_id = a.workspace_id AND c.agent_id = a.agent_id) AS running,
       (SELECT count(*) FROM runs r WHERE r.workspace_id = a.workspace_id
        AND r.agent_id = a.agent_id AND r.status = 'running'), NULL, NULL
FROM agents a
"""


class LoopThread:
    """An event loop of the test's own on a thread: sync rules call the async store."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@dataclass
class Env:
    loop: LoopThread
    pool: asyncpg.pool.Pool
    examples: itertools.count = field(default_factory=itertools.count)
    seen: Counter[str] = field(default_factory=Counter)  # what the sequences exercised


@dataclass
class Run:
    ws: str
    agent: str
    run_id: uuid.UUID
    wake_at: datetime | None
    status: str = "queued"
    wait_reason: str | None = None
    owner: str | None = None
    epoch: int = 0
    attempt: int = 0
    started_at: datetime | None = None
    finished_at: datetime | None = None
    steps: list[tuple[int, int, str]] = field(default_factory=lambda: [(0, 0, "input")])
    approval: uuid.UUID | None = None  # the pending approval it parked on
    unknown_seq: int | None = None  # the unknown outcome it parked on

    def held_at(self, epoch: int) -> bool:
        return self.status == "running" and self.epoch == epoch

    def append(self, kind: str) -> None:
        self.steps.append((len(self.steps), self.epoch, kind))

    def release(self, status: str, reason: str | None, wake_at: datetime | None) -> None:
        self.status, self.wait_reason, self.wake_at, self.owner = status, reason, wake_at, None


@dataclass(frozen=True)
class Grant:
    owner: str
    run_id: uuid.UUID
    epoch: int


@dataclass
class Sent:
    """An executor's last commit, to send again."""

    req: steps.CommitRequest
    landed: bool


def moved(now: datetime, seconds: float) -> datetime:
    return now + timedelta(seconds=seconds)


SKEW = st.sampled_from([0, 0, 0, 0, -500, -2500])  # ms the reader's clock is behind
PICK = st.integers(0, 1 << 16)
AROUND_THE_LEASE = st.integers(LEASE * 1000 - 3_000, LEASE * 1000 + 5_000)  # ms
AROUND_HALF = st.integers(LEASE * 500 - 1_000, LEASE * 500 + 1_000)  # where "keep" renews
PARKS = (
    "renew",
    "renew",
    "sleep",
    "until",
    "approval",
    "human",
    "completed",
    "failed",
    "hand_back",
)


class LeaseMachine(RuleBasedStateMachine):
    env: Env

    def __init__(self) -> None:
        super().__init__()
        next(self.env.examples)  # counts the sequences
        self.call(self._reset())
        self.clock = BASE
        self.runs: dict[uuid.UUID, Run] = {}
        self.caps: dict[tuple[str, str | None], int | None] = {}
        self.held: dict[tuple[str, uuid.UUID], tuple[int, int]] = {}  # -> (epoch, next seq)
        self.grants: list[Grant] = []
        self.sent: dict[str, Sent] = {}
        self.counts: dict[tuple[str, str | None], int] = {}
        self.seen_epochs: dict[uuid.UUID, int] = {}
        self.renewed = False  # whether the last commit that landed renewed its lease

    def call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.env.loop.call(coro)

    @property
    def pool(self) -> asyncpg.pool.Pool:
        return self.env.pool

    async def _reset(self) -> None:
        await self.pool.execute(RESET)

    def now(self, skew_ms: int = 0) -> datetime:
        return self.clock + timedelta(milliseconds=skew_ms)

    def running(self, ws: str, agent: str | None = None) -> int:
        return sum(
            r.status == "running" and r.ws == ws and agent in (None, r.agent)
            for r in self.runs.values()
        )

    # --- setup and the world around the leases ---------------------------------------------

    @initialize(
        cap=st.integers(1, 3),
        agent_caps=st.lists(st.sampled_from([None, 1, 2]), min_size=4, max_size=4),
        admitted=st.lists(
            st.tuples(st.sampled_from(WORKSPACES), st.sampled_from(AGENTS)), max_size=6
        ),
    )
    def setup(
        self, cap: int, agent_caps: list[int | None], admitted: list[tuple[str, str]]
    ) -> None:
        """This example's caps, and the runs it starts with."""
        self.set_workspace_cap(cap)
        pairs = itertools.product(WORKSPACES, AGENTS)
        for (ws, agent), agent_cap in zip(pairs, agent_caps, strict=True):
            self.set_agent_cap(ws, agent, agent_cap)
        self.caps[("wb", None)] = 2  # the free plan
        for ws, agent in admitted:
            self.admit(ws, agent, 0)

    @rule(cap=st.integers(1, 3))
    def set_workspace_cap(self, cap: int) -> None:
        self.call(workspaces.set_plan(self.pool, "wa", "enterprise", cap))
        self.caps[("wa", None)] = cap

    @rule(
        ws=st.sampled_from(WORKSPACES),
        agent=st.sampled_from(AGENTS),
        cap=st.sampled_from([None, 1, 2]),
    )
    def set_agent_cap(self, ws: str, agent: str, cap: int | None) -> None:
        self.call(workspaces.set_agent_cap(self.pool, ws, agent, cap))
        self.caps[(ws, agent)] = cap

    @rule(ws=st.sampled_from(WORKSPACES), agent=st.sampled_from(AGENTS), skew=SKEW)
    def admit(self, ws: str, agent: str, skew: int) -> None:
        if sum(r.status in LIVE for r in self.runs.values()) >= 6:
            return
        now = self.now(skew)
        adm = runs.Admission(
            workspace_id=ws,
            agent_id=agent,
            agent_version=1,
            input="go",
            request_id=None,
            max_steps=1000,
            max_tokens=10**9,
            max_tool_calls=1000,
            deadline_seconds=86400,
        )
        row = self.call(runs.insert_run(self.pool, adm, now=now))
        self.runs[row.run_id] = Run(ws, agent, row.run_id, wake_at=now)

    @rule(
        ms=st.one_of(
            st.integers(0, 5_000), AROUND_HALF, AROUND_THE_LEASE, st.integers(60_000, 200_000)
        )
    )
    def advance_clock(self, ms: int) -> None:
        self.clock += timedelta(milliseconds=ms)

    @rule(pick=PICK, skew=SKEW, ended=st.integers(0, 9))
    def cancel(self, pick: int, skew: int, ended: int) -> None:
        """Cancel a live run (one time in ten, any run: an ended one stays as it is)."""
        if not self.runs:
            return
        live = [r for r in self.runs.values() if r.status in LIVE]
        some = live if live and ended else list(self.runs.values())
        m = some[pick % len(some)]
        now = self.now(skew)
        row = self.call(runs.cancel_run(self.pool, m.ws, m.run_id, "stop", now=now))
        assert (row is not None) == (m.status in LIVE), f"cancel of a {m.status} run"
        self.env.seen[f"cancel_{m.status if row else 'ended'}"] += 1
        if row is not None:
            if m.status == "waiting":  # its approval closes with it (0042): none to decide
                m.approval = None
            m.release("cancelled", None, None)
            m.finished_at = now
            m.append("finish")

    # --- the lease -------------------------------------------------------------------------

    @rule(owner=st.sampled_from(EXECUTORS), batch=st.integers(1, 3), skew=SKEW)
    def claim_again(self, owner: str, batch: int, skew: int) -> None:
        """Claims and commits are what executors mostly do: two rules each, to pick them."""
        self.claim(owner, batch, skew)

    @rule(owner=st.sampled_from(EXECUTORS), batch=st.integers(1, 3), skew=SKEW)
    def claim(self, owner: str, batch: int, skew: int) -> None:
        now = self.now(skew)
        lapsed = [r for r in self.runs.values() if r.status == "running" and r.wake_at <= now]
        takeable = self._takeable(now)
        rows = self.call(lease.claim_due(self.pool, [owner] * batch, LEASE, now=now))
        taken_over = sum(self._claimed(row, owner, now) for row in rows)
        self.env.seen.update(takeover=taken_over, claim=len(rows) - taken_over)
        # A lapsed lease is taken over at its workspace's turn (0047): a full batch may go
        # to workspaces ahead of it in line, a claim with owners left never passes it over
        # (and next_wake_at bounds every lease's end, so its turn comes: COUNTS).
        assert taken_over <= min(batch, len(lapsed)), "a lease taken over twice"
        if len(rows) < batch:
            assert taken_over == len(lapsed), "a lapsed lease was passed over"
        if batch - taken_over >= len(WORKSPACES) and takeable:
            assert len(rows) > taken_over, f"nothing claimed while {takeable} could run"

    def _takeable(self, now: datetime) -> list[uuid.UUID]:
        """Due runs waiting for their turn whose workspace and agent both have room."""
        return [
            r.run_id
            for r in self.runs.values()
            if r.status in ("queued", "waiting")
            and r.wake_at is not None
            and r.wake_at <= now
            and self.running(r.ws) < self.caps[(r.ws, None)]
            and (
                self.caps[(r.ws, r.agent)] is None
                or self.running(r.ws, r.agent) < self.caps[(r.ws, r.agent)]
            )
        ]

    def _claimed(self, row: runs.Run, owner: str, now: datetime) -> bool:
        """Check one claimed run against the model and take it; True for a takeover."""
        m = self.runs[row.run_id]
        assert m.status in LIVE and m.wake_at is not None and m.wake_at <= now, "not due"
        assert (row.lease_owner, row.lease_epoch) == (owner, m.epoch + 1)
        takeover = m.status == "running"
        if not takeover:
            for key in ((m.ws, None), (m.ws, m.agent)):
                cap = self.caps[key]
                assert cap is None or self.running(*key) < cap, f"claimed over the cap of {key}"
        m.status, m.wait_reason, m.owner, m.epoch = "running", None, owner, m.epoch + 1
        m.attempt += takeover
        m.wake_at = moved(now, LEASE)
        m.started_at = m.started_at or now
        self.held[(owner, m.run_id)] = (m.epoch, len(m.steps))
        self.grants.append(Grant(owner, m.run_id, m.epoch))
        return takeover

    @rule(owner=st.sampled_from(EXECUTORS), skew=SKEW)
    def heartbeat(self, owner: str, skew: int) -> None:
        now = self.now(skew)
        keys = [
            lease.LeaseKey(self.runs[run_id].ws, run_id, epoch)
            for (who, run_id), (epoch, _) in self.held.items()
            if who == owner
        ]
        out = self.call(lease.heartbeat(self.pool, owner, keys, LEASE, now=now))
        expected = {k for k in keys if self.runs[k.run_id].held_at(k.epoch)}
        assert set(out.renewed) == expected and not out.past_deadline
        self.env.seen.update(renewed=len(expected), beat_refused=len(keys) - len(expected))
        for key in keys:
            if key in expected:
                assert out.renewed[key] == moved(now, LEASE)
                self.runs[key.run_id].wake_at = moved(now, LEASE)
            else:  # the executor learns it lost the lease
                del self.held[(owner, key.run_id)]

    @rule(
        pick=PICK,
        park=st.sampled_from(PARKS),
        n=st.integers(1, 2),
        wait=st.sampled_from([0, 5, 45, 120]),
        skew=SKEW,
        lazy=st.booleans(),
    )
    def commit_again(self, pick: int, park: str, n: int, wait: int, skew: int, lazy: bool) -> None:
        self.commit(pick, park, n, wait, skew, lazy)

    @rule(
        pick=PICK,
        park=st.sampled_from(PARKS),
        n=st.integers(1, 2),
        wait=st.sampled_from([0, 5, 45, 120]),
        skew=SKEW,
        lazy=st.booleans(),
    )
    def commit(self, pick: int, park: str, n: int, wait: int, skew: int, lazy: bool) -> None:
        """One executor's next write on a run it believes it holds (it may be wrong). A lazy
        one goes on running for an executor that reads renewals off the result ("keep": it
        renews only once half the lease or less is left); else for an older executor."""
        if not self.held:
            return
        park = "keep" if park == "renew" and lazy else park
        (owner, run_id), (epoch, seq) = list(self.held.items())[pick % len(self.held)]
        m, now = self.runs[run_id], self.now(skew)
        if park == "hand_back":
            self._hand_back(owner, m, epoch, now)
            return
        req = self._request(m, epoch, seq, n, park, wait, now)
        current = m.held_at(epoch)
        assert not current or seq == len(m.steps), "the holder's view of its log drifted"
        landed = self._send(req, park, now)
        self.sent[owner] = Sent(req, landed)
        assert landed == current, f"commit at epoch {epoch} of a run at {m.epoch} ({m.status})"
        self.env.seen[park if landed else "commit_refused"] += 1
        if not landed:
            del self.held[(owner, run_id)]
            return
        for s in req.steps:
            m.append(s.kind)
        self._apply(m, park, now, req)
        if park in ("renew", "keep"):
            self.held[(owner, run_id)] = (epoch, seq + n)
        else:
            del self.held[(owner, run_id)]

    def _request(
        self, m: Run, epoch: int, seq: int, n: int, park: str, wait: int, now: datetime
    ) -> steps.CommitRequest:
        kinds = ["model_decision"] * n
        payloads = [{"content": "thinking", "tool_calls": []}] * n
        if park == "approval":
            kinds[-1], payloads[-1] = "approval_requested", {"call_id": "pay"}
        if park == "human":
            kinds[-1] = "tool_result"
            payloads[-1] = {
                "call_id": "c1",
                "tool": "wire",
                "status": "unknown",
                "awaiting": "human",
            }
        new = [
            steps.NewStep(seq + i, k, None, json.dumps(p))
            for i, (k, p) in enumerate(zip(kinds, payloads, strict=True))
        ]
        transition = {
            "renew": steps.Transition(),
            "keep": steps.Transition(),
            "sleep": steps.Transition("waiting", "sleep", wake_after_seconds=wait),
            "until": steps.Transition("waiting", "sleep", wake_at=moved(now, wait)),
            "approval": steps.Transition("waiting", "approval"),
            "human": steps.Transition("waiting", "human"),
            "completed": steps.Transition("completed", text="done"),
            "failed": steps.Transition("failed", text="gave up"),
        }[park]
        return steps.CommitRequest(
            m.ws, m.run_id, epoch, new, transition, renew_always=park != "keep"
        )

    def _send(self, req: steps.CommitRequest, park: str, now: datetime) -> bool:
        """Send a commit; True when it landed (a duplicate is not a landing)."""
        try:
            if park == "approval":
                result = self.call(
                    commit_with_approval(self.pool, req, LEASE, _approval(req), [], now=now)
                )
            else:
                result = self.call(steps.commit(self.pool, req, LEASE, now=now))
        except Fenced:
            return False
        assert not result.duplicate, "a new commit was taken for a retry"
        self.renewed = result.renewed
        return True

    def _apply(self, m: Run, park: str, now: datetime, req: steps.CommitRequest) -> None:
        t = req.transition
        if park == "renew":
            assert self.renewed, "an older executor's commit did not renew"
            m.wake_at = moved(now, LEASE)
        elif park == "keep":
            assert m.wake_at is not None
            renews = m.wake_at <= moved(now, LEASE / 2)
            assert self.renewed == renews, f"renewed {self.renewed}, {m.wake_at - now} left"
            self.env.seen["kept_renewed" if renews else "kept"] += 1
            m.wake_at = moved(now, LEASE) if renews else m.wake_at
        elif park == "sleep":
            m.release("waiting", "sleep", moved(now, t.wake_after_seconds or 0))
        elif park == "until":
            m.release("waiting", "sleep", t.wake_at)
        elif park in ("approval", "human"):
            m.release("waiting", park, None)
            m.approval = _approval(req).approval_id if park == "approval" else None
            m.unknown_seq = req.steps[-1].seq if park == "human" else None
        else:
            m.release(park, None, None)
            m.finished_at = now

    @rule(owner=st.sampled_from(EXECUTORS), skew=SKEW)
    def retry_last_commit(self, owner: str, skew: int) -> None:
        """A commit sent again (its answer was lost): acknowledged once, never applied twice."""
        sent = self.sent.get(owner)
        if sent is None:
            return
        try:
            result = self.call(steps.commit(self.pool, sent.req, LEASE, now=self.now(skew)))
        except Fenced:
            assert not sent.landed, "a landed commit was refused on retry"
            return
        assert sent.landed and result.duplicate, "a retry was applied as a new commit"
        self.env.seen["duplicate"] += 1

    def _hand_back(self, owner: str, m: Run, epoch: int, now: datetime) -> None:
        """The run could not be delivered: give it back (a no-op for a stale epoch)."""
        key = lease.LeaseKey(m.ws, m.run_id, epoch)
        self.call(lease.release_unassigned(self.pool, key, now))
        del self.held[(owner, m.run_id)]
        if m.held_at(epoch):
            m.release("waiting", "handoff", now)
            self.env.seen["handed_back"] += 1

    @rule(
        pick=PICK,
        how=st.sampled_from(["commit", "collide", "finish", "beat", "hand_back"]),
        skew=SKEW,
    )
    def stale_write(self, pick: int, how: str, skew: int) -> None:
        """A writer whose epoch is gone (taken over, parked, finished, cancelled) is refused."""
        stale = [g for g in self.grants if not self.runs[g.run_id].held_at(g.epoch)]
        if not stale:
            return
        g = stale[pick % len(stale)]
        m, now = self.runs[g.run_id], self.now(skew)
        key = lease.LeaseKey(m.ws, g.run_id, g.epoch)
        self.env.seen[f"stale_{how}"] += 1
        if how == "beat":
            out = self.call(lease.heartbeat(self.pool, g.owner, [key], LEASE, now=now))
            assert not out.renewed and not out.past_deadline, "a stale lease was renewed"
            return
        if how == "hand_back":
            self.call(lease.release_unassigned(self.pool, key, now))
            return  # the invariants check that nothing changed
        seq = len(m.steps) - 1 if how == "collide" else len(m.steps)
        park = "completed" if how == "finish" else "renew"
        req = self._request(m, g.epoch, seq, 1, park, 0, now)
        if m.steps[seq:] == [(seq, g.epoch, "model_decision")]:
            # Exactly what that writer last wrote: indistinguishable from its retry.
            assert self.call(steps.commit(self.pool, req, LEASE, now=now)).duplicate
            return
        with pytest.raises(Fenced):
            self.call(steps.commit(self.pool, req, LEASE, now=now))

    # --- events that wake a parked run -----------------------------------------------------

    @rule(pick=PICK, skew=SKEW)
    def decide_approval(self, pick: int, skew: int) -> None:
        pending = [r for r in self.runs.values() if r.approval]
        if not pending:
            return
        m, now = pending[pick % len(pending)], self.now(skew)
        assert m.approval is not None
        woke = self.call(_decide(self.pool, m.ws, m.approval, now))
        assert woke == (m.status == "waiting" and m.wait_reason == "approval")
        self.env.seen[f"approval_woke_{woke}"] += 1
        if woke:
            m.append("approval_decided")
            m.wake_at, m.approval = now, None

    @rule(pick=PICK, skew=SKEW)
    def decide_unknown(self, pick: int, skew: int) -> None:
        pending = [r for r in self.runs.values() if r.unknown_seq is not None]
        if not pending:
            return
        m, now = pending[pick % len(pending)], self.now(skew)
        assert m.unknown_seq is not None
        d = unknowns.Decision(m.ws, m.run_id, m.unknown_seq, "happened", "person:pat")
        try:
            self.call(unknowns.decide(self.pool, d, now=now))
            woke = True
        except unknowns.UndecidableError:
            woke = False
        assert woke == (m.status == "waiting" and m.wait_reason == "human")
        m.unknown_seq = None
        self.env.seen[f"unknown_woke_{woke}"] += 1
        if woke:
            m.append("tool_result")
            m.wake_at = now

    # --- what must hold after every operation ----------------------------------------------

    @invariant()
    def database_matches_the_model(self) -> None:
        rows, log, counts = self.call(self._snapshot())
        self.env.seen["steps"] += 1
        assert {r["run_id"] for r in rows} == set(self.runs)
        for row in rows:
            m = self.runs[row["run_id"]]
            want = (
                m.status,
                m.wait_reason,
                m.wake_at,
                m.owner,
                m.epoch,
                m.attempt,
                m.started_at,
                m.finished_at,
            )
            assert tuple(row)[1:] == want, f"run {m.run_id}: {dict(row)} != model {want}"
            assert row["lease_epoch"] >= self.seen_epochs.get(m.run_id, 0), "epoch went back"
            self.seen_epochs[m.run_id] = row["lease_epoch"]
        by_run: dict[uuid.UUID, list[tuple[int, int, str]]] = {r: [] for r in self.runs}
        for s in log:
            by_run[s["run_id"]].append((s["seq"], s["epoch"], s["kind"]))
        for run_id, got in by_run.items():
            assert got == self.runs[run_id].steps, f"run {run_id}: log {got}"
            assert [seq for seq, _, _ in got] == list(range(len(got))), "seqs not gapless"
            assert all(a[1] <= b[1] for a, b in itertools.pairwise(got)), "epoch went back"
        self._check_counts(counts)

    def _check_counts(self, counts: list[asyncpg.Record]) -> None:
        for c in counts:
            key = (c["workspace_id"], c["agent_id"])
            assert c["running"] == c["actual"] == self.running(*key), f"{key}: counter drifted"
            assert c["cap"] == self.caps[key], f"{key}: cap {c['cap']}"
            # Over the cap only when the cap was lowered under what already ran.
            before = self.counts.get(key, 0)
            assert c["cap"] is None or c["actual"] <= max(c["cap"], before), f"{key} over cap"
            self.counts[key] = c["actual"]
            if c["earliest"] is not None:
                assert c["bound"] is not None and c["bound"] <= c["earliest"], f"{key} lost"

    async def _snapshot(self) -> tuple[list[asyncpg.Record], ...]:
        async with self.pool.acquire() as conn, conn.transaction(isolation="repeatable_read"):
            return (await conn.fetch(RUNS), await conn.fetch(STEP_LOG), await conn.fetch(COUNTS))

    @invariant()
    def at_most_one_live_holder(self) -> None:
        for m in self.runs.values():
            live = {
                g.owner
                for g in self.grants
                if g.run_id == m.run_id
                and m.held_at(g.epoch)
                and m.wake_at is not None
                and m.wake_at > self.clock
            }
            assert len(live) <= 1 and live <= {m.owner}, f"run {m.run_id} held by {live}"
            epochs = [g.epoch for g in self.grants if g.run_id == m.run_id]
            assert epochs == sorted(set(epochs)), "epochs did not strictly increase"


def _approval(req: steps.CommitRequest) -> approvals.NewApproval:
    """The approval a commit parks on, named after its run and epoch (a retry is the same)."""
    return approvals.NewApproval(
        workspace_id=req.workspace_id,
        approval_id=uuid.uuid5(req.run_id, f"approval-{req.epoch}-{req.steps[0].seq}"),
        run_id=req.run_id,
        decision_seq=req.steps[-1].seq,
        call_id=f"pay-{req.epoch}-{req.steps[0].seq}",
        tool="pay",
        arguments_json="{}",
        arguments_sha256="0" * 64,
        approvers=["pat"],
        slack_approvers=[],
        high_risk=False,
        moves_money=False,
        expiry_seconds=3600,
        on_expiry="reject",
        escalate_to=[],
        max_reminders=0,
    )


async def _decide(pool: asyncpg.pool.Pool, ws: str, approval_id: uuid.UUID, now: datetime) -> bool:
    """Approve; False when the run no longer waits for it (nothing is then written)."""
    d = approvals.Decision("approved", "person:pat")
    try:
        async with pool.acquire() as conn, conn.transaction():
            await approvals.decide(conn, ws, approval_id, d, {"decision": "approved"}, now)
    except approvals.RunNotWaiting:
        return False
    return True


@pytest.fixture
def env(db_url: str) -> Iterator[Env]:
    loop = LoopThread()
    pool = loop.call(_open(db_url))
    try:
        yield Env(loop, pool)
    finally:
        loop.call(pool.close())
        loop.close()


async def _open(db_url: str) -> asyncpg.pool.Pool:
    pool = await asyncpg.create_pool(db_url, min_size=1, max_size=2)
    await _seed(pool)
    return pool


async def _seed(pool: asyncpg.pool.Pool) -> None:
    await workspaces.set_plan(pool, "wa", "enterprise", 1)
    await workspaces.set_plan(pool, "wb", "free")
    for ws, agent in itertools.product(WORKSPACES, AGENTS):
        assert await factories.agent_version(pool, ws, agent) == 1


@pytest.mark.timeout(TIMEOUT)
def test_lease_state_machine(env: Env) -> None:
    LeaseMachine.env = env
    run_state_machine_as_test(
        LeaseMachine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    examples = next(env.examples)
    print(f"\n{examples} sequences of up to {STEPS} steps: {dict(sorted(env.seen.items()))}")
    assert examples >= EXAMPLES, "hypothesis ran fewer sequences than asked"
    # The sequences reached every kind of event the invariants are about.
    for events in EXERCISED:
        assert sum(env.seen[e] for e in events) > 0, f"no {events} in {examples} sequences"
