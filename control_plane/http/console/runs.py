"""Runs: the filtered list, a run's timeline (live over server-sent events), unknown outcomes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from control_plane.api.runs import MAX_NOTE_BYTES, decider, resolve_unknown, watch_feed
from control_plane.auth import context as auth_context
from control_plane.auth.principal import Principal
from control_plane.ground import validate
from control_plane.ground.errors import InvalidArgument, NotFound
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
        row = await run_store.get_run(self.c.pool, ws, run_id)
        if row is None:
            raise NotFound(f"run {run_id} not found")
        return row

    async def index(self, request: Request) -> Response:
        return see_other("/console/runs")

    async def runs(self, request: Request) -> Response:
        query = dict(request.query_params)
        found = await store.search_runs(
            self.c.pool, auth_context.workspace(""), run_filter(query), 200
        )
        return render(
            request, "runs.html", found=found, q=query, statuses=STATUSES, wait_reasons=WAIT_REASONS
        )

    async def run(self, request: Request) -> Response:
        row = await self._run(request)
        steps = await step_store.list_steps(
            self.c.pool, row.workspace_id, row.run_id, 0, MAX_STEPS_SHOWN
        )
        pending, _ = await approval_store.list_page(
            self.c.pool, row.workspace_id, approver=None, state="pending", after=None, limit=100
        )
        next_seq = steps[-1].seq + 1 if steps else 0
        return render(
            request,
            "run.html",
            run=row,
            entries=timeline.entries(steps),
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
        return StreamingResponse(
            self._stream(row, from_seq, who, csrf),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def _stream(
        self, row: run_store.Run, from_seq: int, who: Principal, csrf: str
    ) -> AsyncIterator[str]:
        previous: step_store.Step | None = None
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
