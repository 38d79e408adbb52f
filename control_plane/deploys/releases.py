"""Releases: deploys that carry waiting work forward (issues 15 and 41).

An executor declares its release in Hello (AGENTRUN_RELEASE) and the earlier
releases it continues (AGENTRUN_CONTINUES). A run is pinned to a release only
while a turn is in progress on it: the claim (sql/lease.sql) records the
claiming executor's release on the run, and a park with nothing of a turn in
flight (Park.between_turns: a sleep, an approval, a rate limit, a child, a
signal, a person) clears it in the commit that parks (sql/steps.sql), so the
run continues on the newest open release when it wakes; a turn must not mix
releases, a parked run's state is its log, which every release reads. Every
step records the release that wrote it.

Runs on no release go to the newest open release (connected, not draining,
past its canary under the gate): the one promoted last, else the one whose
executors were first seen last; a ramped release (`agentrun releases ramp B
10`) takes its percentage of them by a hash of the run id (release_share in
0037_release_pins.sql). A rollback ends the ramp and drains the release.

A drain (`agentrun releases drain R`) marks the release in the database; each
replica tells its streams of R (Drain) at once or within a heartbeat interval.
Its executors claim nothing new, work on what they hold for the drain's time
(default: each executor's longest turn), then hand each run back at its next
turn boundary, on no release, and exit once they hold none. Only a forced
drain (`--force`, or an executor's second SIGTERM) hands back a turn in
progress; such a run stays on R, waiting for one of R's executors, and R is
not drained while it does (GetRelease lists it; `releases wait-drained` says
so). MoveRunRelease moves a waiting run by hand, audited.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Any

import grpc

from agentrun.v1 import release_pb2, release_pb2_grpc, run_pb2
from control_plane.api import bulk
from control_plane.auth import context as auth_context
from control_plane.dispatch.dispatcher import Dispatcher
from control_plane.dispatch.slots import live_seconds
from control_plane.ground import convert, validate
from control_plane.ground.errors import FailedPrecondition, InvalidArgument, NotFound
from control_plane.store import canary as canary_store
from control_plane.store import releases as store
from control_plane.store.db import Pool
from control_plane.store.runs import Run

SERVICE_NAMES = (
    release_pb2.DESCRIPTOR.services_by_name["ReleaseService"].full_name,
    release_pb2.DESCRIPTOR.services_by_name["CanaryService"].full_name,
)
MAX_FINISH_WITHIN = 24 * 3600.0
# How many of a release's held and waiting runs GetRelease names.
RUNS_LISTED = 100
# How recently an executor must have been seen to count, where no server config is at hand
# (a stream that ends deletes its executor's row at once; this covers a replica that died).
LIVE_SECONDS = 30.0
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")


async def explain_wait(pool: Pool, run: Run, queue: run_pb2.QueuePosition) -> None:
    """A due run whose release has no executor connected says so (GetRun's queue cause)."""
    if queue.cause != run_pb2.QUEUE_WAIT_CAUSE_TURN or not run.release:
        return
    if not await store.connected(pool, run.release, LIVE_SECONDS):
        queue.cause = run_pb2.QUEUE_WAIT_CAUSE_RELEASE_UNAVAILABLE
        queue.release = run.release


def release_name(field: str, value: str) -> str:
    if not value:
        raise InvalidArgument(field, "is required")
    if not _NAME.match(value):
        raise InvalidArgument(field, "must be 1-64 letters, digits, '.', '_', '+' or '-'")
    return value


def _age(now: datetime, since: datetime | None) -> float:
    return max(0.0, (now - since).total_seconds()) if since is not None else 0.0


def to_proto(
    state: store.ReleaseState, newest: bool, runs: Sequence[store.ReleaseRun] = ()
) -> release_pb2.Release:
    msg = release_pb2.Release(
        name=state.release,
        newest=newest,
        draining=state.draining_since is not None,
        executors=state.executors,
        runs_held=state.runs_held,
        oldest_held=convert.duration(_age(state.now, state.oldest_held_since)),
        runs_waiting=state.runs_waiting,
        drained=state.drained,
        runs_completed=state.runs_completed,
        runs_failed=state.runs_failed,
    )
    if state.ramp_percent is not None:
        msg.ramp_percent = state.ramp_percent
    if state.canary_failed_at is not None and closed_by_canary(state):
        # When, where and why its last canary failed.
        failure = canary_store.Failure.parse(state.canary_failed_at, state.canary_failure or "")
        msg.canary_fail_time.CopyFrom(convert.timestamp(failure.at))
        msg.canary_failed_stage = failure.stage
        msg.canary_failure_reason = failure.reason
    for r in runs:
        msg.runs.add(
            workspace_id=r.workspace_id,
            run_id=str(r.run_id),
            status=r.status,
            wait_reason=r.wait_reason or "",
        )
    for name, value in (
        ("first_seen_time", state.first_seen_at),
        ("promote_time", state.promoted_at),
        ("drain_start_time", state.draining_since),
        ("drain_deadline", state.drain_deadline),
        ("canary_pass_time", state.canary_passed_at),
        ("rollback_time", state.rolled_back_at),
    ):
        if (ts := convert.timestamp(value)) is not None:
            getattr(msg, name).CopyFrom(ts)
    return msg


def opened(state: store.ReleaseState) -> bool:
    """Past its canary (or promoted) since its last canary failure (release_opened)."""
    passed = [t for t in (state.canary_passed_at, state.promoted_at) if t is not None]
    if state.canary_failed_at is None:
        return bool(passed)
    return bool(passed) and max(passed) > state.canary_failed_at


def closed_by_canary(state: store.ReleaseState) -> bool:
    """Its last canary failed, and no pass or promote came since: under the gate it takes
    no new run, and no work by hand either."""
    return state.canary_failed_at is not None and not opened(state)


def routable(state: store.ReleaseState, gated: bool) -> bool:
    """Whether the release may take new runs; `gated` is ServerConfig.release_gate."""
    return bool(state.executors) and state.draining_since is None and (opened(state) or not gated)


def newest_of(states: list[store.ReleaseState], gated: bool) -> str | None:
    """The release new runs go to (all of them but a ramp's share): the first (newest)
    routable one not ramped, else the first ramped one (release_share)."""
    open_ = [s for s in states if routable(s, gated)]
    main = [s for s in open_ if s.ramp_percent is None] or open_
    return main[0].release if main else None


def _finish_within(request: Any) -> float | None:
    """A drain's finish_within (None when unset: each executor's own default)."""
    if not request.HasField("finish_within"):
        return None
    seconds: float = request.finish_within.ToNanoseconds() / 1e9
    if not 0 <= seconds <= MAX_FINISH_WITHIN:
        raise InvalidArgument("finish_within", "must be between 0 and 24 hours")
    return seconds


class ReleaseServicer(release_pb2_grpc.ReleaseServiceServicer):
    def __init__(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher
        self._pool: Pool = dispatcher.pool
        self._live = live_seconds(dispatcher.config)
        self._gated = dispatcher.config.release_gate

    async def _releases(self) -> list[release_pb2.Release]:
        states = await store.list_releases(self._pool, self._live)
        newest = newest_of(states, self._gated)
        return [to_proto(s, s.release == newest) for s in states]

    async def _one(self, name: str) -> release_pb2.Release:
        states = await store.list_releases(self._pool, self._live)
        state = next((s for s in states if s.release == name), None)
        if state is None:
            raise NotFound(f"release {name!r} is not known (no executor ever declared it)")
        runs = await store.runs_of(self._pool, name, RUNS_LISTED)
        return to_proto(state, name == newest_of(states, self._gated), runs)

    async def ListReleases(
        self, request: release_pb2.ListReleasesRequest, context: grpc.aio.ServicerContext
    ) -> release_pb2.ListReleasesResponse:
        return release_pb2.ListReleasesResponse(releases=await self._releases())

    async def GetRelease(
        self, request: release_pb2.GetReleaseRequest, context: grpc.aio.ServicerContext
    ) -> release_pb2.GetReleaseResponse:
        name = release_name("name", request.name)
        return release_pb2.GetReleaseResponse(release=await self._one(name))

    async def _refuse_failed_canary(self, name: str, done: str) -> None:
        """Under the canary gate, a release whose last canary failed is not given work by
        hand either: its canary must pass first."""
        states = await store.list_releases(self._pool, self._live, name)
        if self._gated and states and closed_by_canary(states[0]):
            raise FailedPrecondition(
                f"release {name!r} cannot be {done}: its last canary failed "
                f"({states[0].canary_failure or 'no reason recorded'}); it takes work once a "
                f"canary passes (agentrun canary --release {name})"
            )

    async def DrainRelease(
        self, request: release_pb2.DrainReleaseRequest, context: grpc.aio.ServicerContext
    ) -> release_pb2.DrainReleaseResponse:
        name = release_name("name", request.name)
        seconds = _finish_within(request)
        if not await store.drain(self._pool, name, seconds, request.force):
            raise NotFound(f"release {name!r} is not known (no executor ever declared it)")
        await self._dispatcher.tell_drains()
        return release_pb2.DrainReleaseResponse(release=await self._one(name))

    async def PromoteRelease(
        self, request: release_pb2.PromoteReleaseRequest, context: grpc.aio.ServicerContext
    ) -> release_pb2.PromoteReleaseResponse:
        name = release_name("name", request.name)
        await self._refuse_failed_canary(name, "promoted")
        if not await store.promote(self._pool, name):
            raise NotFound(f"release {name!r} is not known (no executor ever declared it)")
        self._dispatcher.poke()
        return release_pb2.PromoteReleaseResponse(release=await self._one(name))

    async def RampRelease(
        self, request: release_pb2.RampReleaseRequest, context: grpc.aio.ServicerContext
    ) -> release_pb2.RampReleaseResponse:
        name = release_name("name", request.name)
        if not 0 <= request.percent <= 100:
            raise InvalidArgument("percent", "must be between 0 and 100")
        await self._refuse_failed_canary(name, "ramped")
        if not await store.ramp(self._pool, name, request.percent):
            raise NotFound(f"release {name!r} is not known (no executor ever declared it)")
        self._dispatcher.poke()
        return release_pb2.RampReleaseResponse(release=await self._one(name))

    async def RollbackRelease(
        self, request: release_pb2.RollbackReleaseRequest, context: grpc.aio.ServicerContext
    ) -> release_pb2.RollbackReleaseResponse:
        name = release_name("name", request.name)
        seconds = _finish_within(request)
        if not await store.rollback(self._pool, name, seconds):
            raise NotFound(f"release {name!r} is not known (no executor ever declared it)")
        await self._dispatcher.tell_drains()
        self._dispatcher.poke()
        return release_pb2.RollbackReleaseResponse(release=await self._one(name))

    async def MoveRunRelease(
        self, request: release_pb2.MoveRunReleaseRequest, context: grpc.aio.ServicerContext
    ) -> release_pb2.MoveRunReleaseResponse:
        ws = validate.slug("workspace_id", request.workspace_id)
        run_id = validate.run_id("run_id", request.run_id)
        to = release_name("release", request.release) if request.release else None
        move = store.Move(ws, run_id, to, auth_context.current().label, "")
        try:
            was = await store.move(self._pool, move)
        except LookupError:
            raise NotFound(f"run {run_id} not found") from None
        except store.NotMovable as exc:
            raise FailedPrecondition(
                f"run {run_id} is {exc}: only a queued or waiting run moves"
            ) from None
        self._dispatcher.poke()
        return release_pb2.MoveRunReleaseResponse(from_release=was or "", to_release=to or "")

    async def BulkMoveRunsRelease(
        self, request: release_pb2.BulkMoveRunsReleaseRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[release_pb2.BulkMoveRunsReleaseResponse]:
        """MoveRunRelease by a filter, as bulk cancel goes (control_plane/api/bulk.py): the
        action audited once, the runs moved in batches, each batch one transaction."""
        ws = validate.slug("workspace_id", request.workspace_id)
        to = release_name("release", request.release) if request.release else None
        wanted = bulk.checked_filter(
            request.filter, request.all, "move every unfinished run of the workspace"
        )

        async def move(ws: str, run_ids: list[uuid.UUID]) -> int:
            moved = await store.move_many(self._pool, ws, run_ids, to)
            if moved:
                self._dispatcher.poke()
            return moved

        progress = release_pb2.BulkMoveRunsReleaseResponse(
            action_id=str(uuid.uuid4()), dry_run=request.dry_run
        )
        audit_as = ("runs.bulk_moved_release", {"to_release": to})
        async for p in bulk.batches(self._pool, ws, wanted, True, progress, audit_as, move):
            yield p
