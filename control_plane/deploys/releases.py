"""Blue-green releases: runs finish on the release they started on (issue 15).

An executor declares its release in Hello (AGENTRUN_RELEASE) and the earlier
releases it continues (AGENTRUN_CONTINUES). The claim (sql/lease.sql) records
the claiming executor's release on a run the first time it is claimed and
from then on leases it only to executors of that release or of one that
continues it; a run on no release yet goes to the newest release with
executors connected: the one promoted last (`agentrun releases promote`),
else the one whose executors were first seen last. A draining release takes
no new runs.

A drain (`agentrun releases drain R`) marks the release in the database; each
replica tells its streams of R (Drain) at once or within a heartbeat interval.
Its executors claim nothing new, finish what they hold within the deadline,
then hand back at a step boundary what is still held: back on R, for another
executor of R. A run whose release has no executor left waits, visibly
(GetRelease.runs_waiting; GetRun's queue cause RELEASE_UNAVAILABLE names no
release but the run's own `release` does), until an operator moves it with
MoveRunRelease, which the run's workspace audit log records. Nothing moves a
run silently.
"""

from __future__ import annotations

import re
from datetime import datetime

import grpc

from agentrun.v1 import release_pb2, release_pb2_grpc, run_pb2
from control_plane.auth import context as auth_context
from control_plane.dispatch.dispatcher import Dispatcher
from control_plane.dispatch.slots import live_seconds
from control_plane.ground import convert, validate
from control_plane.ground.errors import FailedPrecondition, InvalidArgument, NotFound
from control_plane.store import releases as store
from control_plane.store.db import Pool
from control_plane.store.runs import Run

SERVICE_NAMES = (
    release_pb2.DESCRIPTOR.services_by_name["ReleaseService"].full_name,
    release_pb2.DESCRIPTOR.services_by_name["CanaryService"].full_name,
)
DEFAULT_FINISH_WITHIN = 60.0
MAX_FINISH_WITHIN = 24 * 3600.0
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


def to_proto(state: store.ReleaseState, newest: bool) -> release_pb2.Release:
    msg = release_pb2.Release(
        name=state.release,
        newest=newest,
        draining=state.draining_since is not None,
        executors=state.executors,
        runs_held=state.runs_held,
        oldest_held=convert.duration(_age(state.now, state.oldest_held_since)),
        runs_waiting=state.runs_waiting,
        drained=state.drained,
    )
    for name, value in (
        ("first_seen_time", state.first_seen_at),
        ("promote_time", state.promoted_at),
        ("drain_start_time", state.draining_since),
        ("drain_deadline", state.drain_deadline),
        ("canary_pass_time", state.canary_passed_at),
    ):
        if (ts := convert.timestamp(value)) is not None:
            getattr(msg, name).CopyFrom(ts)
    return msg


def routable(state: store.ReleaseState, gated: bool) -> bool:
    """Whether the release may take new runs; `gated` is ServerConfig.release_gate."""
    opened = state.promoted_at is not None or state.canary_passed_at is not None
    return bool(state.executors) and state.draining_since is None and (opened or not gated)


def newest_of(states: list[store.ReleaseState], gated: bool) -> str | None:
    """The release new runs go to: the first (newest) that may take them (sql/lease.sql)."""
    return next((s.release for s in states if routable(s, gated)), None)


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
        found = [r for r in await self._releases() if r.name == name]
        if not found:
            raise NotFound(f"release {name!r} is not known (no executor ever declared it)")
        return found[0]

    async def ListReleases(
        self, request: release_pb2.ListReleasesRequest, context: grpc.aio.ServicerContext
    ) -> release_pb2.ListReleasesResponse:
        return release_pb2.ListReleasesResponse(releases=await self._releases())

    async def GetRelease(
        self, request: release_pb2.GetReleaseRequest, context: grpc.aio.ServicerContext
    ) -> release_pb2.GetReleaseResponse:
        name = release_name("name", request.name)
        return release_pb2.GetReleaseResponse(release=await self._one(name))

    async def DrainRelease(
        self, request: release_pb2.DrainReleaseRequest, context: grpc.aio.ServicerContext
    ) -> release_pb2.DrainReleaseResponse:
        name = release_name("name", request.name)
        seconds = DEFAULT_FINISH_WITHIN
        if request.HasField("finish_within"):
            seconds = request.finish_within.ToNanoseconds() / 1e9
            if not 0 <= seconds <= MAX_FINISH_WITHIN:
                raise InvalidArgument("finish_within", "must be between 0 and 24 hours")
        if not await store.drain(self._pool, name, seconds):
            raise NotFound(f"release {name!r} is not known (no executor ever declared it)")
        for session in self._dispatcher.sessions():
            session.drain_if({name: seconds})
        return release_pb2.DrainReleaseResponse(release=await self._one(name))

    async def PromoteRelease(
        self, request: release_pb2.PromoteReleaseRequest, context: grpc.aio.ServicerContext
    ) -> release_pb2.PromoteReleaseResponse:
        name = release_name("name", request.name)
        if not await store.promote(self._pool, name):
            raise NotFound(f"release {name!r} is not known (no executor ever declared it)")
        self._dispatcher.poke()
        return release_pb2.PromoteReleaseResponse(release=await self._one(name))

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
