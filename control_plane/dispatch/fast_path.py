"""The low-latency fast path: a session turn dispatched by SendMessage itself.

For an agent version flagged `fast_path` (AgentSpec field 11: turns on a
self-hosted model, where time to first token matters), SendMessage admits the
turn exactly as before (one transaction under the session's lock) and, in the
same transaction and request, leases that one run to a connected executor
stream of this replica with a free credit; once the transaction committed it
sends the Assignment. No claim cycle, no poll.

Nothing a claim checks is skipped. The caller was authenticated and its
workspace checked by SendMessage. The stream is picked as a claim groups them
(not draining, its executor credential serving the workspace, carrying every
tool the version needs) and the lease is one conditional UPDATE of exactly that
run (sql/sessions.sql fast_path_lease), a new statement after taking the
workspace row lock a claim takes (so workspace and agent caps hold with claims
and fast paths together, lease.sql's argument), holding the claim's release
routing and tool check again: the queued, due run goes to `running` at epoch +
1, fenced like any lease (every later write names the epoch). Credits are
reserved as after a claim. The lease runs in a savepoint: when no stream has a
free credit, or the UPDATE finds the run not eligible (at a cap, on another
release), or it fails, the turn is committed queued and the claim is poked;
nothing is lost, it only waits for a claim as every other run does. The
Assignment leaves only after the commit: an executor never acts on a lease
that might still roll back.

Its lease. The lease has the server's duration (AGENTRUN_LEASE_SECONDS, 30 s
by default), so every path that renews a lease (heartbeats, commits) keeps it
without a per-run duration; the Assignment tells the executor to renew it every
2 s (AGENTRUN_FAST_PATH_HEARTBEAT_SECONDS) instead of the session's interval.
A fast-path run whose holder died is taken over by the normal claim, which
leases lapsed runs first with every check; the recovery scanner below only
pokes the claim when one lapsed, so it is picked up within a scan however long
the claim's poll is (AGENTRUN_CLAIM_POLL_SECONDS).

Streaming. The executor forwards the model's text deltas on its stream; the replica's
DeltaHub (dispatch/deltas.py) fans them out to WatchRun(deltas=true) watchers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge

from control_plane.credits.claims import reserve_claimed
from control_plane.dispatch.dispatcher import Dispatcher
from control_plane.dispatch.slots import Stream
from control_plane.ops import metrics
from control_plane.store import sessions as session_store
from control_plane.store.db import Connection, Pool
from control_plane.store.runs import Run
from control_plane.store.steps import Step

log = logging.getLogger(__name__)

FAST_PATH = Counter(
    "agentrun_fast_path_turns",
    "Fast-path session turns by outcome: dispatched (no claim), queued (left to the claim)",
    ["outcome"],
    registry=metrics.REGISTRY,
)
FREE_SLOTS = Gauge(
    "agentrun_free_executor_slots",
    "Free slots (credits) of the executor streams connected to this replica: what a fast-path "
    "turn can be dispatched to",
    registry=metrics.REGISTRY,
)


def spec_of(version_row: Any) -> dict[str, Any]:
    spec = version_row["spec"]
    return dict(json.loads(spec) if isinstance(spec, str) else spec)


def wanted(version_row: Any) -> bool:
    """Whether turns of this agent version take the fast path."""
    return bool(spec_of(version_row).get("fast_path"))


def code_tools(version: Any) -> list[str]:
    """The tools an executor must carry to run this version: its pinned built-ins (registry
    tools come with the assignment); a version published before the registry, all of them."""
    code = version["code_tools"]
    if code is not None:
        return list(json.loads(code) if isinstance(code, str) else code)
    return list(spec_of(version).get("tools") or [])


def pick(
    sessions: Sequence[Stream], workspace_id: str, tools: Sequence[str], release: str | None = None
) -> Any:
    """The stream with the most free credits that a claim could lease this turn to (one of
    `release`'s, for a turn on it already)."""
    needed = set(tools)
    fits = [
        s
        for s in sessions
        if s.executor_id
        and not s.liveness.dead
        and s.slots.fits(workspace_id, needed)
        and release in (None, s.slots.release)
    ]
    return max(fits, key=lambda s: s.slots.credits, default=None)


@dataclass
class Leased:
    """A fast-path lease taken in the admission's transaction, not yet handed over."""

    session: Stream
    run: Run
    steps: list[Step]
    metered: bool  # its workspace has a credit account: reserve, as after a claim

    def give_back(self) -> None:
        """The transaction did not commit: the slot taken for it is free again."""
        self.session.slots.give_back()


class FastPath:
    """Leases fast-path turns to a stream of this replica's dispatcher and hands them over."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher
        self._pool: Pool = dispatcher.pool
        FREE_SLOTS.set_function(lambda: sum(s.slots.credits for s in dispatcher.sessions()))

    async def lease_in(
        self,
        conn: Connection,
        workspace_id: str,
        run_id: uuid.UUID,
        tools: Sequence[str],
        release: str | None = None,
    ) -> list[Leased]:
        """In the admission's transaction (a savepoint of its own): lease the turn just
        admitted (on `release` already, if given) to the stream with the most free slots;
        [] (the turn stays queued, for the claim) when none has one or the lease is
        refused."""
        session = pick(self._dispatcher.sessions(), workspace_id, tools, release)
        if session is None:
            FAST_PATH.labels("queued").inc()
            return []
        session.slots.take()  # taken now: a claim running meanwhile cannot spend it too
        config = self._dispatcher.config
        try:
            leased = await session_store.fast_lease(
                conn,
                workspace_id,
                run_id,
                session.executor_id,
                config.lease_seconds,
                carried=sorted(session.slots.tools),
                release=session.slots.claim_release(config),
            )
        except Exception as exc:  # noqa: BLE001 - the savepoint rolled back; the claim takes it
            log.warning("fast path of run %s failed, leaving it to the claim: %s", run_id, exc)
            leased = None
        if leased is None:
            session.slots.give_back()
            FAST_PATH.labels("queued").inc()
            return []
        return [Leased(session, *leased)]

    async def hand_over(self, leased: Leased) -> bool:
        """After the admission committed: reserve credits as after a claim, then send the
        Assignment. False: the stream went away meanwhile (the run is runnable again), or
        the database failed (the lease lapses and the run is taken over like any other)."""
        try:
            return await self._hand_over(leased)
        except Exception as exc:  # noqa: BLE001 - the turn is committed; its lease will lapse
            leased.session.slots.give_back()
            log.warning("fast path of run %s could not hand over: %s", leased.run.run_id, exc)
            return False

    async def _hand_over(self, leased: Leased) -> bool:
        session, run = leased.session, leased.run
        if leased.metered and await reserve_claimed(self._pool, [run], {run.workspace_id}):
            session.slots.give_back()  # out of credits: parked or failed by the reservation
            return True
        if not await self._dispatcher.assign(session, run, leased.steps):
            FAST_PATH.labels("queued").inc()  # its stream went away meanwhile: handed back
            return False
        FAST_PATH.labels("dispatched").inc()
        log.info(
            "run %s of workspace %s dispatched on the fast path to %s (epoch %d)",
            run.run_id,
            run.workspace_id,
            session.executor_id,
            run.lease_epoch,
        )
        return True


async def recover_forever(pool: Pool, poke: Callable[[], None], every: float) -> None:
    """The fast path's recovery scanner: when a fast-path run's lease lapsed, wake the
    claim, which leases lapsed runs first (with every check) to a stream with room."""
    while True:
        await asyncio.sleep(every)
        try:
            if await session_store.fast_path_lapsed(pool):
                poke()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the database may be restarting
            log.info("fast-path recovery scan failed: %s", exc)


__all__ = [
    "FastPath",
    "Leased",
    "recover_forever",
    "wanted",
]
