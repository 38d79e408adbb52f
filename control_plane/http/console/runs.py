"""Runs: the filtered list, a run's timeline (live over server-sent events), unknown outcomes."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from control_plane.api.runs import MAX_NOTE_BYTES, decider, resolve_unknown, watch_feed
from control_plane.auth import context as auth_context
from control_plane.auth import privacy
from control_plane.auth.principal import Principal
from control_plane.ground import validate
from control_plane.ground.errors import InvalidArgument, NotFound
from control_plane.http.console import profile as profiling
from control_plane.http.console import timeline
from control_plane.http.console.web import Console, fragment, render, see_other
from control_plane.store import approvals as approval_store
from control_plane.store import console as store
from control_plane.store import runs as run_store
from control_plane.store import steps as step_store
from control_plane.store import unknowns

STATUSES = ("queued", "running", "waiting", "completed", "failed", "cancelled")
WAIT_REASONS = (
    "approval",
    "human",
    "repeat",
    "rate",
    "model",
    "sleep",
    "child",
    "connection",
    "signal",
    "credits",
    "session",
    "executor_error",
    "concurrency_key",
)
DECISIONS = {
    "happened": "it happened",
    "not_happened": "it did not happen",
    "retry": "retry it",
    "fail_run": "fail the run",
}
MAX_STEPS_SHOWN = 2000
MAX_SEQ = 2**31 - 1  # steps.seq is an int4


def _choice(field: str, value: str, allowed: tuple[str, ...]) -> str | None:
    if value and value not in allowed:
        raise InvalidArgument(field, f"must be one of {', '.join(allowed)}")
    return value or None


def _when(field: str, value: str) -> datetime | None:
    """A datetime-local (or ISO 8601) value, in UTC when it names no zone."""
    if not value:
        return None
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidArgument(field, "must be a date and time (YYYY-MM-DDTHH:MM)") from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _seq(value: str) -> int | None:
    """A step number sent as text (Last-Event-ID, from_seq), None when it is not one. The
    largest seq a step can have (an int4) is as far as it goes: nothing comes after it."""
    if not value.isascii() or not value.isdigit():  # "²".isdigit(), yet int("²") fails
        return None
    return min(int(value), MAX_SEQ)


FILTER_FIELDS = ("status", "agent", "trigger", "wait_reason", "from", "to", "q")
PAGE_SIZE, MAX_PAGE_SIZE = 50, 500
CURSOR = "%Y%m%dT%H%M%S.%fZ"


def cursor_of(row: run_store.Run) -> str:
    """A run's place in the list, for a next/previous link: its created_at (UTC, to the
    microsecond, as stored) and run id."""
    return f"{row.created_at.astimezone(UTC).strftime(CURSOR)}~{row.run_id}"


def _cursor(field: str, value: str) -> store.Cursor | None:
    if not value:
        return None
    at, _, run_id = value.partition("~")
    try:
        return datetime.strptime(at, CURSOR).replace(tzinfo=UTC), uuid.UUID(run_id)
    except ValueError:
        raise InvalidArgument(field, "is not a cursor from a next/previous link") from None


def _size(value: str) -> int:
    if not value:
        return PAGE_SIZE
    if not value.isascii() or not value.isdigit() or not 1 <= int(value) <= MAX_PAGE_SIZE:
        raise InvalidArgument("size", f"must be a number of runs from 1 to {MAX_PAGE_SIZE}")
    return int(value)


def run_filter(q: dict[str, str]) -> store.RunFilter:
    def slug(field: str) -> str | None:
        return validate.slug(field, q[field]) if q.get(field) else None

    return store.RunFilter(
        status=_choice("status", q.get("status", ""), STATUSES),
        agent_id=slug("agent"),
        trigger_id=slug("trigger"),
        wait_reason=_choice("wait_reason", q.get("wait_reason", ""), WAIT_REASONS),
        created_from=_when("from", q.get("from", "")),
        created_to=_when("to", q.get("to", "")),
        search=validate.text("q", q.get("q", ""), max_bytes=200).strip() or None,
    )


class RunPages:
    def __init__(self, console: Console) -> None:
        self.c = console

    async def _run(self, request: Request) -> run_store.Run:
        ws = auth_context.workspace("")
        run_id = validate.run_id("run_id", request.path_params["run_id"])
        await privacy.check_run(self.c.pool, ws, run_id, privacy.reader())
        row = await run_store.get_run(self.c.pool, ws, run_id)
        if row is None:
            raise NotFound(f"run {run_id} not found")
        return row

    async def index(self, request: Request) -> Response:
        return see_other("/console/runs")

    async def runs(self, request: Request) -> Response:
        listed = await self._listed(request)
        return render(request, "runs.html", wait_reasons=WAIT_REASONS, **listed)

    async def live(self, request: Request) -> Response:
        """The open list's rows and counts again, as JSON of two HTML fragments: the page
        polls it (console.js) and swaps them in, so runs that start or finish elsewhere
        show without a reload."""
        listed = await self._listed(request)
        rows = fragment("_runs.html", "rows", listed["found"], **listed)
        counts = fragment("_runs.html", "counts", listed["counts"], **listed)
        pager = fragment("_runs.html", "pager", **listed)
        return JSONResponse(
            {"rows": rows, "counts": counts, "pager": pager}, headers={"Cache-Control": "no-store"}
        )

    async def _listed(self, request: Request) -> dict[str, Any]:
        """One page of the filtered list, newest first, by keyset: `after` (a cursor) pages
        to older runs, `before` to newer ones; neither is the newest page."""
        q = dict(request.query_params)
        f = run_filter(q)
        size = _size(q.get("size", ""))
        ws = auth_context.workspace("")
        seen_by = privacy.reader()  # a private session's runs are its members' (privacy.py)
        after, before = _cursor("after", q.get("after", "")), _cursor("before", q.get("before", ""))
        if after and before:
            raise InvalidArgument("before", "give after or before, not both")
        if before:
            found = await store.search_runs_newer(
                self.c.pool, ws, f, size + 1, before, reader=seen_by
            )
            has_newer, found = len(found) > size, found[-size:]
            has_older = True
        else:
            found = await store.search_runs(self.c.pool, ws, f, size + 1, after, reader=seen_by)
            has_older, found = len(found) > size, found[:size]
            has_newer = after is not None
        if found and has_newer and not before:  # past the first page: is anything newer now?
            first = found[0].run
            probe = (first.created_at, first.run_id)
            has_newer = bool(
                await store.search_runs_newer(self.c.pool, ws, f, 1, probe, reader=seen_by)
            )
        counts = await store.run_counts(self.c.pool, ws, replace(f, status=None), reader=seen_by)
        kept = {k: q[k] for k in FILTER_FIELDS if q.get(k)}
        if q.get("size"):
            kept["size"] = str(size)
        base = urlencode(kept)
        here = urlencode({**kept, **{k: q[k] for k in ("after", "before") if q.get(k)}})
        older = newer = None
        if found and has_older:
            older = urlencode({**kept, "after": cursor_of(found[-1].run)})
        if found and has_newer:
            newer = urlencode({**kept, "before": cursor_of(found[0].run)})
        elif not found and (after or before):
            newer = base  # a page past the end (its runs were deleted): back to the newest
        return {
            "found": found,
            "q": q,
            "counts": counts,
            "total": sum(counts.values()),
            "base": base,
            "base_without_status": urlencode({k: v for k, v in kept.items() if k != "status"}),
            "statuses": STATUSES,
            "here": here,
            "older": older,
            "newer": newer,
            "size": size,
        }

    async def run(self, request: Request) -> Response:
        row = await self._run(request)
        internals = privacy.sees_internals()  # a reader's timeline shows projections
        steps = [
            privacy.project_step(s, internals)
            for s in await step_store.list_steps(
                self.c.pool, row.workspace_id, row.run_id, 0, MAX_STEPS_SHOWN
            )
        ]
        pending, _ = await approval_store.list_page(
            self.c.pool, row.workspace_id, approver=None, state="pending", after=None, limit=100
        )
        next_seq = steps[-1].seq + 1 if steps else 0
        return render(
            request,
            "run.html",
            run=row,
            entries=timeline.entries(steps),
            profile=profiling.profile(steps, row.lease_epoch, row.lease_owner),
            seconds=profiling.seconds,
            dollars=profiling.dollars,
            next_seq=next_seq,
            approvals=[a for a in pending if a.run_id == row.run_id],
            decisions=DECISIONS,
            run_id=row.run_id,
        )

    async def events(self, request: Request) -> Response:
        """The run's timeline as server-sent events, from WatchRun's feed: `run` (the summary,
        whenever its state changes), `step` (a timeline row) and `end` once it has ended."""
        row = await self._run(request)  # 404 before the stream starts
        last = _seq(request.headers.get("last-event-id", ""))
        asked = _seq(request.query_params.get("from_seq", "")) or 0
        from_seq = min(last + 1, MAX_SEQ) if last is not None else asked
        who, csrf = request.state.who, request.state.csrf
        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        if request.method == "HEAD":  # the answer a GET starts with: no stream held open
            return Response(status_code=200, media_type="text/event-stream", headers=headers)
        return StreamingResponse(
            self._stream(row, from_seq, who, csrf), media_type="text/event-stream", headers=headers
        )

    async def _stream(
        self, row: run_store.Run, from_seq: int, who: Principal, csrf: str
    ) -> AsyncIterator[str]:
        previous: step_store.Step | None = None
        internals = privacy.sees_internals_of(who)  # a reader's timeline shows projections
        if from_seq > 0:
            earlier = await step_store.list_steps(
                self.c.pool, row.workspace_id, row.run_id, from_seq - 1, 1
            )
            previous = earlier[0] if earlier else None
        values = {"csrf": csrf, "decisions": DECISIONS, "who": who, "run_id": row.run_id}
        # The workspace was the principal's (checked in `events`); the feed needs no more of
        # it, and a generator closed in another task could not reset acting_as's context.
        async for item in watch_feed(self.c.pool, row.workspace_id, row.run_id, from_seq):
            if isinstance(item, run_store.Run):
                yield sse("run", fragment("_timeline.html", "summary", item, **values))
                continue
            item = privacy.project_step(item, internals)
            entry = timeline.entry(item, previous)
            previous = item
            yield sse(
                "step",
                fragment("_timeline.html", "step_row", entry, **values),
                event_id=str(item.seq),
            )
        yield sse("end", "")

    async def resolve(self, request: Request) -> Response:
        """A person's decision on an unknown outcome, through ResolveUnknownOutcome's domain."""
        row = await self._run(request)
        form = request.state.form
        seq = validate.in_range("seq", int(request.path_params["seq"]), 0, MAX_SEQ)
        decision = form.get("decision", "")
        if decision not in DECISIONS:
            raise InvalidArgument("decision", "must be happened, not_happened, retry or fail_run")
        note = validate.text("note", form.get("note", ""), max_bytes=MAX_NOTE_BYTES)
        wanted = unknowns.Decision(row.workspace_id, row.run_id, seq, decision, decider(""), note)
        await resolve_unknown(self.c.pool, wanted)
        self.c.on_runnable()
        return see_other(f"/console/runs/{row.run_id}")

    async def unknowns(self, request: Request) -> Response:
        waiting = await store.awaiting_person(self.c.pool, auth_context.workspace(""), 200)
        return render(request, "unknowns.html", waiting=waiting, decisions=DECISIONS)


def sse(event: str, data: str, event_id: str = "") -> str:
    lines = [f"event: {event}"] + ([f"id: {event_id}"] if event_id else [])
    lines += [f"data: {line}" for line in (data.splitlines() or [""])]
    return "\n".join(lines) + "\n\n"
