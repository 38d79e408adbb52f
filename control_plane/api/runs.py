"""RunService: admission, reads, cancellation, the WatchRun stream, unknown-outcome decisions."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import grpc

from agentrun.v1 import run_pb2, run_pb2_grpc
from control_plane.api import bulk, events, pause, signals
from control_plane.api.run_filters import label_filters, labels
from control_plane.auth import audit, privacy
from control_plane.auth import context as auth_context
from control_plane.connections import triggering
from control_plane.deploys import releases
from control_plane.dispatch.deltas import DeltaHub, with_deltas
from control_plane.ground import convert, validate
from control_plane.ground.config import RunDefaults
from control_plane.ground.errors import (
    Aborted,
    DomainError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from control_plane.ops import run_figures
from control_plane.runs import children, concurrency_keys, forks
from control_plane.store import agents as agent_store
from control_plane.store import forks as fork_store
from control_plane.store import lease as lease_store
from control_plane.store import questions, unknowns
from control_plane.store import runs as store
from control_plane.store import steps as step_store
from control_plane.store import streams as stream_store
from control_plane.store.admission import MAX_INPUT_BYTES, Admission, admission
from control_plane.store.db import Pool, transaction
from ground import run_labels

TERMINAL = {"completed", "failed", "cancelled"}
WATCH_POLL_SECONDS = 0.2
MAX_NOTE_BYTES = 4096
OUTCOME_DECISIONS = {
    run_pb2.OUTCOME_DECISION_HAPPENED: "happened",
    run_pb2.OUTCOME_DECISION_NOT_HAPPENED: "not_happened",
    run_pb2.OUTCOME_DECISION_RETRY: "retry",
    run_pb2.OUTCOME_DECISION_FAIL_RUN: "fail_run",
}


def encode_page_token(created: datetime, run_id: uuid.UUID) -> str:
    raw = json.dumps({"t": created.isoformat(), "id": str(run_id)}).encode()
    return base64.urlsafe_b64encode(raw).decode()


def decode_page_token(token: str) -> tuple[datetime, uuid.UUID] | None:
    if not token:
        return None
    try:
        data = validate.json_value("page_token", base64.urlsafe_b64decode(token.encode()))
        return datetime.fromisoformat(data["t"]), uuid.UUID(data["id"])
    except (ValueError, KeyError, TypeError, InvalidArgument):
        raise InvalidArgument("page_token", "is not a token this service issued") from None


def undecidable(exc: unknowns.UndecidableError) -> DomainError:
    """The status of a decision that was not recorded."""
    if isinstance(exc, unknowns.RunNotFound | unknowns.StepNotFound):
        return NotFound(str(exc))
    if isinstance(exc, unknowns.AlreadyDecided):
        return Aborted(f"the unknown outcome was {exc}")
    return FailedPrecondition(str(exc))


def decider(typed: str) -> str:
    """Who decides: the authenticated principal. A typed `decided_by` must be its name or empty."""
    who = auth_context.current()
    validate.text("decided_by", typed, max_bytes=200)
    if typed and typed not in (who.name, who.label):
        raise PermissionDenied(f"decided_by: you are {who.label}; a decision records its caller")
    return who.label


def watched_state(run: store.Run) -> tuple[str, str | None, datetime | None]:
    """What a watcher is told about when it changes (a running run's wake_at is its lease)."""
    return run.status, run.wait_reason, run.wake_at if run.status != "running" else None


def _waiting_longer_than(request: run_pb2.ListRunsRequest) -> float | None:
    """ListRuns' waiting_longer_than in seconds (None when unset), validated."""
    if not request.HasField("waiting_longer_than"):
        return None
    seconds = request.waiting_longer_than.ToTimedelta().total_seconds()
    if seconds < 0 or seconds > 10 * 365 * 86400:
        raise InvalidArgument("waiting_longer_than", "must be between 0 and 10 years")
    return seconds


def _list_filters(request: run_pb2.ListRunsRequest) -> tuple[datetime | None, str | None]:
    """ListRuns' create_after and search, validated (None when unset)."""
    since = None
    if request.HasField("create_after"):
        try:
            since = request.create_after.ToDatetime(UTC)
        except (ValueError, OverflowError):
            raise InvalidArgument("create_after", "is not a valid timestamp") from None
    search = validate.text("search", request.search, max_bytes=200)
    if "\x00" in search:
        raise InvalidArgument("search", "contains a NUL character")
    return since, search or None


class RunServicer(run_pb2_grpc.RunServiceServicer):
    def __init__(
        self,
        pool: Pool,
        defaults: RunDefaults,
        on_runnable: Callable[[], None],
        on_cancel: Callable[[str, uuid.UUID], None],
        deltas: DeltaHub | None = None,
        on_pause: Callable[[str, uuid.UUID], None] | None = None,
    ) -> None:
        self._pool = pool
        self._defaults = defaults
        self._on_runnable = on_runnable
        self._on_cancel = on_cancel
        # Asks a running run's holder on this replica to hand it back (PauseRun).
        self._on_pause = on_pause or (lambda ws, run_id: None)
        self._versions = agent_store.Versions()
        # Fast-path runs' model output on this replica (WatchRunRequest.deltas).
        self._deltas = deltas

    async def _get(self, workspace_id: str, run_id: uuid.UUID) -> store.Run:
        """The run, or NOT_FOUND: also for one the caller may not see (a private session's
        turn: control_plane/auth/privacy.py)."""
        await privacy.check_run(self._pool, workspace_id, run_id, privacy.reader())
        row = await store.get_run(self._pool, workspace_id, run_id)
        if row is None:
            raise NotFound(f"run {run_id} not found")
        return row

    async def _guard(self, workspace_id: str, run_id: str) -> None:
        """NOT_FOUND for a run the caller may not see, before an RPC naming it acts; a
        request naming no run well is left to the RPC to refuse, as it always did."""
        try:
            ws = auth_context.workspace(workspace_id)
            key = uuid.UUID(run_id)
        except (DomainError, ValueError):
            return
        await privacy.check_run(self._pool, ws, key, privacy.reader())

    async def StartRun(
        self, request: run_pb2.StartRunRequest, context: grpc.aio.ServicerContext
    ) -> run_pb2.StartRunResponse:
        ws = auth_context.workspace(request.workspace_id)
        agent_id = validate.slug("agent_id", request.agent_id)
        version = validate.non_negative("agent_version", request.agent_version)
        text = validate.text("input", request.input, max_bytes=MAX_INPUT_BYTES, required=True)
        request_id = validate.text("request_id", request.request_id, max_bytes=200) or None
        priority = validate.priority("priority", request.priority)
        tags, metadata = labels(request.tags, request.metadata_json)
        if version:
            ver = await self._versions.get(self._pool, ws, agent_id, version)
        else:
            ver = await self._versions.latest(self._pool, ws, agent_id)
        if ver is None:
            raise NotFound(f"agent {agent_id!r} has no version {version or 'published'}")
        via = await triggering.input_payload(self._pool, ws, text, request.trigger_connection_id)
        came_in: dict[str, Any] | None = dict(via) if via is not None else None
        started_by = auth_context.current().label
        if tags or metadata:
            # In the input step too: the run's set_metadata calls start from it.
            came_in = dict(came_in or {"text": text})
            if tags:
                came_in["tags"] = tags
            if metadata:
                came_in["metadata"] = metadata

        def admit(ver: Any) -> Admission:
            return admission(
                ver,
                self._defaults,
                text,
                started_by=started_by,
                request_id=request_id,
                input_payload=came_in,
                priority=priority,
                tags=tags,
                metadata=run_labels.encode(metadata) if metadata else None,
            )

        # The latest version as this replica last saw it, checked by the insert itself.
        row = await store.insert_run(self._pool, admit(ver), latest=not version)
        if row is None and not version:
            # A newer version was published since, or the request_id was used: read the
            # latest now. Versions only grow, so the same one means the check passed and
            # the request_id was used; a newer one is admitted, as if nothing was cached.
            fresh = await self._versions.latest(self._pool, ws, agent_id, fresh=True)
            assert fresh is not None, "a published agent keeps its versions"
            if fresh["version"] != ver["version"]:
                row = await store.insert_run(self._pool, admit(fresh))
        if row is None:
            assert request_id is not None
            row = await store.get_run_by_request(self._pool, ws, agent_id, request_id)
            assert row is not None, "a used request_id names a run"
            return run_pb2.StartRunResponse(run=convert.run(row), created=False)
        row = await concurrency_keys.as_admitted(self._pool, row)
        self._on_runnable()
        return run_pb2.StartRunResponse(run=convert.run(row), created=True)

    async def GetRun(
        self, request: run_pb2.GetRunRequest, context: grpc.aio.ServicerContext
    ) -> run_pb2.GetRunResponse:
        ws = auth_context.workspace(request.workspace_id)
        row = await self._get(ws, validate.run_id("run_id", request.run_id))
        msg = convert.run(row)
        msg.child_run_ids.extend(await children.child_ids(self._pool, ws, row.run_id))
        if row.wait_reason == concurrency_keys.WAIT_REASON:
            key_queue = await concurrency_keys.queue_position(self._pool, ws, row.run_id)
            if key_queue is not None:
                msg.queue.CopyFrom(key_queue)
        elif row.status in ("queued", "waiting"):
            pos = await lease_store.queue_position(self._pool, ws, row.run_id)
            queue = convert.queue_position(pos, row.wait_reason) if pos else None
            if queue is not None:
                await releases.explain_wait(self._pool, row, queue)
                await pause.explain_pause(self._pool, row, queue)
                msg.queue.CopyFrom(queue)
        return run_pb2.GetRunResponse(run=msg)

    async def ListRuns(
        self, request: run_pb2.ListRunsRequest, context: grpc.aio.ServicerContext
    ) -> run_pb2.ListRunsResponse:
        ws = auth_context.workspace(request.workspace_id)
        size = validate.in_range("page_size", request.page_size or 50, 1, 500)
        agent_id = validate.slug("agent_id", request.agent_id) if request.agent_id else None
        status = None
        if request.status:
            if request.status not in convert.STATUS_FROM_PROTO:
                raise InvalidArgument("status", f"unknown status {request.status}")
            status = convert.STATUS_FROM_PROTO[request.status]
        after = decode_page_token(request.page_token)
        if request.forked_from_run_id:
            source = validate.run_id("forked_from_run_id", request.forked_from_run_id)
            page = await fork_store.list_forks(
                self._pool,
                ws,
                source,
                after=after,
                agent_id=agent_id,
                status=status,
                limit=size,
                reader=privacy.reader(),
            )
        else:
            since, search = _list_filters(request)
            tag, contains = label_filters(request.tag, request.metadata)
            page = await store.list_runs(
                self._pool,
                ws,
                after=after,
                agent_id=agent_id,
                status=status,
                limit=size,
                created_since=since,
                search=search,
                waiting_longer_than=_waiting_longer_than(request),
                tag=tag,
                metadata=contains,
                reader=privacy.reader(),
            )
        last = page.runs[-1] if page.runs and page.has_more else None
        token = encode_page_token(last.created_at, last.run_id) if last else ""
        return run_pb2.ListRunsResponse(
            runs=[convert.run(r) for r in page.runs], next_page_token=token
        )

    async def ListRunSteps(
        self, request: run_pb2.ListRunStepsRequest, context: grpc.aio.ServicerContext
    ) -> run_pb2.ListRunStepsResponse:
        ws = auth_context.workspace(request.workspace_id)
        run_id = validate.run_id("run_id", request.run_id)
        from_seq = validate.non_negative("from_seq", request.from_seq)
        size = validate.in_range("page_size", request.page_size or 200, 1, 1000)
        await self._get(ws, run_id)
        rows = await step_store.list_steps(self._pool, ws, run_id, from_seq, size)
        next_seq = rows[-1].seq + 1 if len(rows) == size else 0
        internals = privacy.sees_internals()  # a reader's steps are projections
        return run_pb2.ListRunStepsResponse(
            steps=[convert.step(privacy.project_step(r, internals)) for r in rows],
            next_seq=next_seq,
        )

    async def CancelRun(
        self, request: run_pb2.CancelRunRequest, context: grpc.aio.ServicerContext
    ) -> run_pb2.CancelRunResponse:
        ws = auth_context.workspace(request.workspace_id)
        run_id = validate.run_id("run_id", request.run_id)
        reason = validate.text("reason", request.reason, max_bytes=1000) or "cancelled"
        await privacy.check_run(self._pool, ws, run_id, privacy.reader())
        async with transaction(self._pool) as conn:
            row = await store.cancel_run(conn, ws, run_id, reason)
            if row is not None:
                await audit.record(conn, "run.cancelled", "run", str(run_id), {"reason": reason})
        if row is None:
            current = await self._get(ws, run_id)
            raise FailedPrecondition(f"run {run_id} already ended: {current.status}")
        self._on_cancel(ws, run_id)
        for child in await children.closed_with(self._pool, row):  # its parent-close policy
            self._on_cancel(ws, child)
        run_figures.FIGURES.cancelled(row)
        return run_pb2.CancelRunResponse(run=convert.run(row))

    async def WatchRun(
        self, request: run_pb2.WatchRunRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[run_pb2.WatchRunResponse]:
        ws = auth_context.workspace(request.workspace_id)
        run_id = validate.run_id("run_id", request.run_id)
        await privacy.check_run(self._pool, ws, run_id, privacy.reader())
        feed = watch_feed(self._pool, ws, run_id, watch_from(request))
        internals = privacy.sees_internals()  # a reader's steps are projections
        if not request.deltas or self._deltas is None:
            async for item in feed:
                yield _watched(item, internals)
            return
        with self._deltas.watch(ws, run_id) as deltas:
            async for event in with_deltas(feed, deltas):
                yield _watched(event, internals)

    async def ResolveUnknownOutcome(
        self, request: run_pb2.ResolveUnknownOutcomeRequest, context: grpc.aio.ServicerContext
    ) -> run_pb2.ResolveUnknownOutcomeResponse:
        ws = auth_context.workspace(request.workspace_id)
        run_id = validate.run_id("run_id", request.run_id)
        if request.seq <= 0:
            raise InvalidArgument("seq", "must name the unknown tool_result step (seq > 0)")
        decision = OUTCOME_DECISIONS.get(request.decision)
        if decision is None:
            raise InvalidArgument("decision", "must be HAPPENED, NOT_HAPPENED, RETRY or FAIL_RUN")
        decided_by = decider(request.decided_by)
        await privacy.check_run(self._pool, ws, run_id, privacy.reader())
        note = validate.text("note", request.note, max_bytes=MAX_NOTE_BYTES)
        wanted = unknowns.Decision(ws, run_id, request.seq, decision, decided_by, note)
        run_row, step = await resolve_unknown(self._pool, wanted)
        self._on_runnable()
        return run_pb2.ResolveUnknownOutcomeResponse(
            run=convert.run(run_row), step=convert.step(step)
        )

    async def ForkRun(
        self, request: run_pb2.ForkRunRequest, context: grpc.aio.ServicerContext
    ) -> run_pb2.ForkRunResponse:
        await self._guard(request.workspace_id, request.run_id)
        req = forks.ForkRequest(
            workspace_id=auth_context.workspace(request.workspace_id),
            run_id=validate.run_id("run_id", request.run_id),
            from_seq=validate.non_negative("from_seq", request.from_seq),
            agent_version=validate.non_negative("agent_version", request.agent_version),
            priority=(
                validate.priority("priority", request.priority)
                if request.HasField("priority")
                else None
            ),
        )
        row = await forks.fork(self._pool, self._defaults, req)
        self._on_runnable()
        return run_pb2.ForkRunResponse(run=convert.run(row))

    async def SignalRun(
        self, request: run_pb2.SignalRunRequest, context: grpc.aio.ServicerContext
    ) -> run_pb2.SignalRunResponse:
        await self._guard(request.workspace_id, request.run_id)
        return await signals.signal_run(self._pool, request, self._on_runnable)

    async def PublishEvent(
        self, request: run_pb2.PublishEventRequest, context: grpc.aio.ServicerContext
    ) -> run_pb2.PublishEventResponse:
        return await events.publish_event(self._pool, request, self._on_runnable, self._on_cancel)

    async def BulkCancelRuns(
        self, request: run_pb2.BulkCancelRunsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[run_pb2.BulkCancelRunsResponse]:
        async for progress in bulk.bulk_cancel(self._pool, request, self._on_cancel):
            yield progress

    async def BulkRerunRuns(
        self, request: run_pb2.BulkRerunRunsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[run_pb2.BulkRerunRunsResponse]:
        async for progress in bulk.bulk_rerun(
            self._pool, self._defaults, request, self._on_runnable
        ):
            yield progress

    async def PauseRun(
        self, request: run_pb2.PauseRunRequest, context: grpc.aio.ServicerContext
    ) -> run_pb2.PauseRunResponse:
        await self._guard(request.workspace_id, request.run_id)
        return await pause.pause_run(self._pool, request, self._on_pause)

    async def ResumeRun(
        self, request: run_pb2.ResumeRunRequest, context: grpc.aio.ServicerContext
    ) -> run_pb2.ResumeRunResponse:
        await self._guard(request.workspace_id, request.run_id)
        return await pause.resume_run(self._pool, request, self._on_runnable)

    async def SetQueuePaused(
        self, request: run_pb2.SetQueuePausedRequest, context: grpc.aio.ServicerContext
    ) -> run_pb2.SetQueuePausedResponse:
        return await pause.set_queue_paused(self._pool, request, self._on_runnable)


def _watched(
    item: store.Run | step_store.Step | run_pb2.RunDelta, internals: bool
) -> run_pb2.WatchRunResponse:
    """The event, with where it ends in the run's Durable Stream (docs/streams.md); a
    step as the watcher may see it (privacy.project_step)."""
    if isinstance(item, store.Run):
        return run_pb2.WatchRunResponse(run=convert.run(item))
    if isinstance(item, run_pb2.RunDelta):
        offset = stream_store.run_delta_offset(item.seq, item.epoch, item.index)
        return run_pb2.WatchRunResponse(delta=item, offset=offset)
    return run_pb2.WatchRunResponse(
        step=convert.step(privacy.project_step(item, internals)),
        offset=stream_store.run_step_offset(item.seq),
    )


def watch_from(request: run_pb2.WatchRunRequest) -> int:
    """The first step seq a watch sends: its stream offset's, else its from_seq."""
    if not request.offset:
        return validate.non_negative("from_seq", request.from_seq)
    if request.offset == "-1":
        return 0
    if not stream_store.OFFSET_FORMAT.match(request.offset):
        raise InvalidArgument("offset", "must be -1 or an offset of the run's stream")
    return stream_store.offset_parts(request.offset)[0]


async def watch_feed(
    pool: Pool, ws: str, run_id: uuid.UUID, next_seq: int = 0
) -> AsyncIterator[store.Run | step_store.Step]:
    """The feed of WatchRun and of the console's live timeline: the run, then every step
    from `next_seq`, and the run again whenever its state changes, until it ends."""
    row = await store.get_run(pool, ws, run_id)
    if row is None:
        raise NotFound(f"run {run_id} not found")
    yield row
    seen = watched_state(row)
    while True:
        steps = await step_store.list_steps(pool, ws, run_id, next_seq, 500)
        for s in steps:
            yield s
            next_seq = s.seq + 1
        if steps:
            continue
        row = await store.get_run(pool, ws, run_id)
        if row is None:
            raise NotFound(f"run {run_id} not found")
        state = watched_state(row)
        if state != seen:
            seen = state
            yield row
        if row.status in TERMINAL:
            # Terminal rows get no more steps, but one may have landed
            # between the steps read and the row read: read once more.
            for s in await step_store.list_steps(pool, ws, run_id, next_seq, 500):
                yield s
            return
        await asyncio.sleep(WATCH_POLL_SECONDS)


async def resolve_unknown(
    pool: Pool, wanted: unknowns.Decision
) -> tuple[store.Run, step_store.Step]:
    """Record a person's decision on an unknown outcome, once, with its audit row
    (ResolveUnknownOutcome and the console). Raises the domain error of a refusal."""

    async def audited(conn: Any) -> None:
        detail = {"seq": wanted.seq, "decision": wanted.decision}
        # A Slack click has no principal in context: the verified user is the actor.
        actor = wanted.decided_by if wanted.decided_by.startswith("slack:") else None
        await audit.record(
            conn,
            "unknown_outcome.resolved",
            "run",
            str(wanted.run_id),
            detail,
            workspace_id=wanted.workspace_id,
            actor=actor,
        )
        why = f"answered {wanted.decision} by {wanted.decided_by}"
        await questions.close(conn, wanted.workspace_id, wanted.run_id, wanted.seq, why)

    try:
        return await unknowns.decide(pool, wanted, audited)
    except unknowns.UndecidableError as exc:
        raise undecidable(exc) from None
