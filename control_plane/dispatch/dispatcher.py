"""The replica's dispatcher: one fair claim (a short transaction) per batch for all its sessions."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import faults
from agentrun.v1 import agent_pb2, tool_pb2
from agentrun.v1 import executor_pb2 as pb
from control_plane.credits.claims import reserve_claimed
from control_plane.dispatch.deltas import DeltaHub
from control_plane.dispatch.liveness import release_on_break
from control_plane.dispatch.slots import ClaimGroup, Stream
from control_plane.ground import constraints, convert
from control_plane.ground.config import ServerConfig
from control_plane.ops import metrics
from control_plane.store import agents as agent_store
from control_plane.store import executor_tools
from control_plane.store import lease as lease_store
from control_plane.store import releases as release_store
from control_plane.store import steps as step_store
from control_plane.store import tools as tool_store
from control_plane.store import workspaces as workspace_store
from control_plane.store.db import Pool
from control_plane.store.errors import transient
from control_plane.store.runs import Run
from control_plane.store.steps import Step

log = logging.getLogger(__name__)
Pinned = tuple[agent_pb2.AgentVersion, list[tool_pb2.Tool]]
# The most bytes of assignments sent in one message to an executor that reads batches (a
# larger assignment goes alone, as to any executor): far under the executor's 64 MiB
# receive limit, and small enough that one message never holds a stream's others long.
ASSIGNMENT_BATCH_BYTES = 1024 * 1024
# The most "seen before" values an assignment carries per rule (issue 48).
SEEN_LIMIT = 1000
# A claim that passed over a workspace with due runs because another claimer held it
# (another replica's claim, most often: lease.Claimed.others_due) is tried again this soon,
# then at twice the pause while it keeps taking nothing, up to the longest pause (or the
# poll interval if shorter); one that takes runs starts again from the first. The flag is
# only raised while another claimer is at work on a due workspace, so these claims last
# no longer than that.
OTHERS_DUE_PAUSE, OTHERS_DUE_MAX_PAUSE = 0.005, 0.05


def owner_slots(sessions: list[Stream], batch: int) -> list[str]:
    """Round-robin one owner entry per wanted slot, at most `batch` in all."""
    owners: list[str] = []
    wanted = {s.executor_id: s.slots.credits for s in sessions if s.slots.credits > 0}
    while wanted and len(owners) < batch:
        for executor_id in list(wanted):
            owners.append(executor_id)
            wanted[executor_id] -= 1
            if not wanted[executor_id]:
                del wanted[executor_id]
            if len(owners) == batch:
                break
    return owners


class Dispatcher:
    """Turns executor credits into claimed runs and delivers the assignments."""

    def __init__(self, pool: Pool, config: ServerConfig) -> None:
        self.pool = pool
        self.config = config
        self._sessions: dict[str, Stream] = {}
        self._wake = asyncio.Event()
        # Agent versions and the registry tools they pinned are immutable: cached forever.
        self._versions: dict[tuple[str, str, int], Pinned] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._touched_at = 0.0
        # The claimed batch being delivered while the next claim runs (at most one).
        self._delivering: asyncio.Task[None] | None = None
        # The pause before the next claim after one passed over a held workspace with due
        # runs (lease.Claimed.others_due); None: the poll interval.
        self._retry_in: float | None = None
        # Model output of fast-path runs, for this replica's WatchRun watchers.
        self.deltas = DeltaHub()
        # Told of every stream registered (on_register).
        self._on_register: list[Callable[[Stream], None]] = []

    def on_register(self, callback: Callable[[Stream], None]) -> None:
        """`callback` for every stream registered, once its executor is welcomed: a feature
        that acts on an executor's connect (the release self-check, deploys/self_check.py)
        registers here, as commit effects do on the pipeline, not in the session. It must
        not block: it starts its work elsewhere."""
        self._on_register.append(callback)

    def register(self, session: Stream) -> None:
        # A reconnecting executor replaces its old session (same executor id).
        self._sessions[session.executor_id] = session
        self.poke()
        for callback in self._on_register:
            callback(session)

    def unregister(self, session: Stream) -> None:
        if self._sessions.get(session.executor_id) is session:
            del self._sessions[session.executor_id]
        # Its runs may be taken over within seconds, not at lease expiry.
        leases = session.slots.held_leases()
        self._in_background(release_on_break(self.pool, session, leases, self.poke))

    def _in_background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _touch(self) -> None:
        """Every heartbeat interval: the executors of this replica's streams are connected."""
        now = asyncio.get_running_loop().time()
        if now - self._touched_at < self.config.heartbeat_seconds:
            return
        self._touched_at = now
        await executor_tools.touch(self.pool, [s.id for s in self._sessions.values()])
        # Releases known (a Hello's record may have failed); a drain asked of another
        # replica reaches this one's streams within a beat.
        await release_store.seen(self.pool, *{s.slots.release for s in self._sessions.values()})
        await self.tell_drains()

    async def tell_drains(self) -> None:
        """Tell this replica's streams of the releases draining now (deploys/releases.py);
        another replica's streams learn within a heartbeat interval."""
        draining = await release_store.draining(self.pool)
        for session in self.sessions():
            session.drain_if(draining)

    def sessions(self) -> list[Stream]:
        return list(self._sessions.values())

    def poke(self) -> None:
        """Claim soon: new credits, a new run, or a finished wait on this replica."""
        self._wake.set()

    def cancel(self, workspace_id: str, run_id: uuid.UUID, reason: str = "cancelled") -> None:
        for session in self._sessions.values():
            session.cancel(workspace_id, run_id, reason)

    def pause(self, workspace_id: str, run_id: uuid.UUID) -> None:
        """PauseRun: the holder on this replica hands the run back at its next step boundary."""
        for session in self._sessions.values():
            session.pause(workspace_id, run_id)

    async def run(self) -> None:
        """Claim loop: wake on a poke or every poll interval."""
        poll = self.config.claim_poll_seconds
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), min(self._retry_in or poll, poll))
            self._wake.clear()
            try:
                await self._touch()
                took, others_due = 0, False
                while True:
                    claimed, passed_over = await self._claim_once()
                    took, others_due = took + claimed, others_due or passed_over
                    if claimed < self.config.claim_batch:
                        break  # else a full batch: there may be more due right now
                self._retry_in = self._next_retry(took) if others_due else None
                await self._delivered()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the database may be restarting
                log.warning("claim failed, retrying: %s", exc)
                await asyncio.sleep(self.config.claim_poll_seconds)

    def _next_retry(self, took: int) -> float:
        """The pause before claiming again after a claim passed over a held workspace."""
        if took or self._retry_in is None:
            return OTHERS_DUE_PAUSE
        return min(2 * self._retry_in, OTHERS_DUE_MAX_PAUSE, self.config.claim_poll_seconds)

    async def _delivered(self) -> None:
        """Wait for the batch being delivered, if any (its own errors are logged there)."""
        if self._delivering is not None:
            await asyncio.wait([self._delivering])
            self._delivering = None

    async def _claim_once(self) -> tuple[int, bool]:
        """One claim per executor scope and tool set; the largest batch any of them got, and
        whether any passed over a held workspace with due runs (lease.Claimed.others_due).

        Executors carrying different tools claim apart, each only the runs whose
        agent version needs no tool it lacks; so do executors of different
        releases (control_plane/deploys/releases.py). A draining stream claims nothing."""
        groups: dict[ClaimGroup, list[Stream]] = {}
        for session in self._sessions.values():
            if session.slots.draining or session.liveness.dead:
                continue
            groups.setdefault(session.slots.claim_group(), []).append(session)
        claimed, others_due = 0, False
        for (scope, tools, _, _), sessions in groups.items():
            rows = await self._claim_for(sessions, scope, tools)
            claimed, others_due = max(claimed, len(rows)), others_due or rows.others_due
        return claimed, others_due

    async def _claim_for(
        self,
        sessions: list[Stream],
        scope: tuple[str, ...] | None,
        tools: frozenset[str],
    ) -> lease_store.Claimed:
        owners = owner_slots(sessions, self.config.claim_batch)
        if not owners:
            return lease_store.Claimed()
        with metrics.CLAIM_SECONDS.time():
            rows = await lease_store.claim_due(
                self.pool,
                owners,
                self.config.lease_seconds,
                scope=scope,
                carried=sorted(tools),
                on_takeover=_taken_over,
                release=sessions[0].slots.claim_release(self.config),
            )
        for row in rows:
            metrics.claimed(row.workspace_id)
        # Each run's slot is taken now, before any await: the next claim, which runs while
        # this batch is delivered, sees only the slots still free.
        batch = [(self._take_slot(row), row) for row in rows]
        await self._delivered()  # never more than one batch in delivery
        if batch:
            self._delivering = asyncio.create_task(self._deliver_batch(batch, rows.metered))
            self._background.add(self._delivering)
            self._delivering.add_done_callback(self._background.discard)
        return rows

    def _gone(self, session: Stream) -> bool:
        """Whether `session` can take no run: declared dead, or ended. An ended stream's
        break released the runs it held then (unregister); a run recorded on it after that
        would wait out its whole lease instead of being handed back."""
        return session.liveness.dead or self._sessions.get(session.executor_id) is not session

    def _take_slot(self, run: Run) -> Stream | None:
        """The session a claimed run goes to, its credit for it taken; None: it cannot go
        (the stream went away, or spent the credit on a fast-path turn meanwhile)."""
        session = self._sessions.get(run.lease_owner or "")
        if session is None or session.liveness.dead or not session.slots.take():
            return None
        return session

    async def _deliver_batch(
        self, batch: list[tuple[Stream | None, Run]], metered: frozenset[str]
    ) -> None:
        """Reserve credits for the batch's metered runs (`metered`: their workspaces, read
        by the claim), read their step logs (both at once), then send each run to its
        session; a run that cannot go is handed back."""
        try:
            runs = [run for session, run in batch if session is not None]
            logs_read = step_store.steps_for_runs(
                self.pool, [(r.workspace_id, r.run_id) for r in runs]
            )
            if any(r.workspace_id in metered for r in runs):
                stopped, logs = await asyncio.gather(
                    reserve_claimed(self.pool, runs, metered), logs_read
                )
            else:  # nothing to reserve: no query, no task
                stopped, logs = set(), await logs_read
            outgoing: dict[Stream, list[tuple[Run, list[Step]]]] = {}
            for session, run in batch:
                if session is not None and run.run_id in stopped:
                    session.slots.give_back()  # stopped at claim (out of credits): not sent
                elif session is None or self._gone(session):
                    # Its stream ended meanwhile: runnable again now, not at lease expiry.
                    await lease_store.release_unassigned(self.pool, _lease(run))
                else:
                    outgoing.setdefault(session, []).append((run, logs[run.run_id]))
            for session, items in outgoing.items():
                if session.reads_batches:
                    await self._assign_together(session, items)
                else:
                    for run, steps in items:
                        await self.assign(session, run, steps)
        except Exception as exc:  # noqa: BLE001 - undelivered runs lapse and are claimed again
            log.warning("delivering claimed runs failed: %s", exc)

    async def assign(self, session: Stream, run: Run, steps: list[Step]) -> bool:
        """Send a leased run to `session`, whose credit for it is taken already; False (the
        run handed back, runnable again) when the stream ended or was declared dead
        meanwhile."""
        message = pb.ConnectResponse()
        if not await self._built(session, message.assignment, run, steps):
            return False
        # Checked after the last await: nothing is ever sent into a stream that is gone.
        if self._gone(session):
            await lease_store.release_unassigned(self.pool, _lease(run))
            return False
        _record(session, run)
        session.send(message)
        return True

    async def _assign_together(self, session: Stream, items: list[tuple[Run, list[Step]]]) -> None:
        """`assign` for several runs of one stream whose executor reads batches: as few
        messages as ASSIGNMENT_BATCH_BYTES allows instead of one a run (each message is a
        gRPC write with its own completion, on both ends of the stream). Each assignment is
        written where it goes, in its message, not built apart and copied in."""
        messages: list[pb.ConnectResponse] = []
        size = 0
        built: list[Run] = []  # those whose Assignment was built
        for run, steps in items:
            if not messages or size >= ASSIGNMENT_BATCH_BYTES:
                messages.append(pb.ConnectResponse())
                size = 0
            batch = messages[-1].assignments.assignments
            assignment = batch.add()
            if not await self._built(session, assignment, run, steps):
                del batch[-1]
                continue
            built.append(run)
            n = assignment.ByteSize()
            if len(batch) > 1 and size + n > ASSIGNMENT_BATCH_BYTES:  # over: opens the next
                messages.append(pb.ConnectResponse())
                messages[-1].assignments.assignments.add().CopyFrom(assignment)
                del batch[-1]
                size = 0
            size += n
        # Checked after the last await, as in assign.
        if self._gone(session):
            for run in built:
                await lease_store.release_unassigned(self.pool, _lease(run))
            return
        for run in built:
            _record(session, run)
        for message in messages:
            if message.assignments.assignments:  # empty when its every run was dropped
                session.send(_alone_if_one(message))

    async def _built(
        self, session: Stream, msg: pb.Assignment, run: Run, steps: list[Step]
    ) -> bool:
        """The run's Assignment, written into the empty `msg` where it already is; False
        when it cannot be built. One such run must not hold up the others claimed with it
        (they would all lapse, be claimed together again and fail again, every lease
        period): it is settled alone and its slot's credit given back. When the database
        could not be reached, it is runnable again now, as an undelivered run is. Anything
        else would fail again at every claim (a bug, or data no check foresaw): the run
        fails, visibly, its reason naming a request id the control plane's log has the
        error under."""
        try:
            faults.raises("control_plane.dispatch.assignment")
            version, tools = await self._version(run.workspace_id, run.agent_id, run.agent_version)
            set_assignment(msg, run, version, steps, self.config.fast_path_heartbeat_seconds, tools)
            for tool, argument in constraints.seen_before_lookups(version.spec):
                values = await step_store.seen_values(
                    self.pool, run.workspace_id, tool, argument, SEEN_LIMIT
                )
                msg.seen_values.add(tool=tool, argument=argument, values=values)
            if names := constraints.workspace_lists(version.spec):
                # The workspace's named allowlists (issue 48), into the assignment's copy.
                lists = await workspace_store.allowlists(self.pool, run.workspace_id, names)
                constraints.merge_workspace_lists(msg.agent_version.spec, lists)
            return True
        except Exception as exc:  # noqa: BLE001 - this run's own failure, settled below
            failure = exc
        session.slots.give_back()
        try:
            if transient(failure):
                log.warning(
                    "run %s: its assignment could not be built, handed back: %s",
                    run.run_id,
                    failure,
                )
                await lease_store.release_unassigned(self.pool, _lease(run))
                return False
            request_id = uuid.uuid4().hex[:12]
            log.error(
                "run %s: its assignment could not be built; failing the run (request %s)",
                run.run_id,
                request_id,
                exc_info=failure,
            )
            reason = f"internal error while building the run's assignment (request {request_id})"
            await lease_store.fail_held(self.pool, _lease(run), reason)
        except Exception as exc:  # noqa: BLE001 - its lease lapses and it is claimed again
            log.warning("run %s: could not settle its undeliverable claim: %s", run.run_id, exc)
        return False

    async def _version(self, ws: str, agent_id: str, version: int) -> Pinned:
        """The agent version and the definitions of the workspace's own registry tools it
        pinned (never another workspace's; built-ins come from the executor's catalogue).
        Both are immutable, so a replica may cache them forever."""
        key = (ws, agent_id, version)
        if key not in self._versions:
            row = await agent_store.get_version(self.pool, ws, agent_id, version)
            assert row is not None, f"run references missing agent version {key}"
            pins = tool_store.pins_from_json(row.get("tool_versions"))
            own = await tool_store.pinned(self.pool, ws, [p for p in pins if not p.builtin])
            self._versions[key] = (convert.agent_version(row), own)
        return self._versions[key]


def set_assignment(
    msg: pb.Assignment,
    run: Run,
    version: agent_pb2.AgentVersion,
    steps: list[Step],
    heartbeat_seconds: float,
    tools: Sequence[tool_pb2.Tool] = (),
) -> None:
    """The Assignment of a run (claimed or fast), with the registry tools its version pinned
    (a fast-path version's says how often to renew), written into the empty `msg` where it
    already is: a message given to a constructor, or appended to a repeated field, is
    copied in."""
    msg.agent_version.CopyFrom(version)
    msg.tools.extend(tools)
    convert.set_run(msg.run, run)
    for s in steps:
        convert.set_step(msg.steps.add(), s)
    if version.spec.fast_path:
        convert.set_duration(msg.heartbeat_interval, heartbeat_seconds)


def _record(session: Stream, run: Run) -> None:
    """The run is the stream's now: recorded so that the stream's break releases it early."""
    session.slots.hold(_lease(run))


def _alone_if_one(message: pb.ConnectResponse) -> pb.ConnectResponse:
    """A batch of one goes as a plain Assignment."""
    batch = message.assignments.assignments
    return pb.ConnectResponse(assignment=batch[0]) if len(batch) == 1 else message


def _lease(run: Run) -> lease_store.LeaseKey:
    return lease_store.LeaseKey(run.workspace_id, run.run_id, run.lease_epoch)


def _taken_over(run: Run) -> None:
    metrics.TAKEOVERS.labels(run.workspace_id).inc()
    log.info(
        "run %s of workspace %s taken over at epoch %d (its lease lapsed)",
        run.run_id,
        run.workspace_id,
        run.lease_epoch,
    )


__all__ = ["Dispatcher", "owner_slots", "set_assignment"]
