"""Actions on a run: cancel, fork from a step, retry, signal, move between releases.

Each is two requests: a GET shows what will happen, with the role the action needs (and
whether the signed-in principal holds it), and the confirmation form; its POST (with the
session's CSRF token, as every console form) does it through the gRPC servicer's own
method (CancelRun, ForkRun, SignalRun), acting as the principal, or for a move through the
release store as MoveRunRelease does. Refusals are the domain's (a finished run cannot be
cancelled: 409 and the reason).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response

from agentrun.v1 import run_pb2
from control_plane.auth import access, privacy
from control_plane.auth import context as auth_context
from control_plane.auth.access import Need
from control_plane.deploys.releases import release_name
from control_plane.ground import validate
from control_plane.ground.errors import FailedPrecondition, InvalidArgument, NotFound
from control_plane.http.console.runs import FILTER_FIELDS as FILTERS
from control_plane.http.console.runs import run_filter
from control_plane.http.console.web import Console, render, see_other
from control_plane.http.services import Services
from control_plane.store import console as console_store
from control_plane.store import releases as release_store
from control_plane.store import runs as run_store

TERMINAL = ("completed", "failed", "cancelled")


@dataclass(frozen=True)
class Action:
    name: str
    title: str
    need: Need
    what: str  # what will happen, for the confirmation


ACTIONS = {
    a.name: a
    for a in (
        Action(
            "cancel",
            "Cancel the run",
            Need.OPERATE,
            "The run ends as cancelled now. Its executor is fenced: nothing it does after "
            "this commits. A tool call already sent is not undone. This cannot be reversed.",
        ),
        Action(
            "fork",
            "Fork from a step",
            Need.OPERATE,
            "A new run starts, queued, with a copy of this run's steps up to and including "
            "the step you choose; it goes on from there with the agent version you name (this "
            "run's by default). This run is not changed. No tool call is repeated: the copied "
            "results are read from the log.",
        ),
        Action(
            "retry",
            "Retry from the start",
            Need.OPERATE,
            "A new run starts, queued, with this run's input only (a fork from step 0): every "
            "model and tool call is made again. This run is not changed.",
        ),
        Action(
            "signal",
            "Send a signal",
            Need.OPERATE,
            "The signal goes into the run's mailbox; a wait_for_signal call for its name "
            "gets its payload (a run waiting for it wakes). The event id makes a resend a "
            "no-op.",
        ),
        Action(
            "move",
            "Move to another release",
            Need.PLATFORM,
            "The run (queued or waiting, held by nobody) is pinned to the release you name, or "
            "to none (the newest takes it). Its next claim is by that release's executors.",
        ),
    )
}


class ActionPages:
    def __init__(self, console: Console, services: Services | None) -> None:
        self.c = console
        self.services = services

    async def _run(self, request: Request) -> run_store.Run:
        ws = auth_context.workspace("")
        run_id = validate.run_id("run_id", request.path_params["run_id"])
        row = await run_store.get_run(self.c.pool, ws, run_id)
        if row is None:
            raise NotFound(f"run {run_id} not found")
        return row

    def _action(self, request: Request) -> Action:
        name = request.path_params["action"]
        if name not in ACTIONS:
            raise NotFound(f"no action {name!r}: one of {', '.join(ACTIONS)}")
        return ACTIONS[name]

    def _runs(self) -> Any:
        if self.services is None:
            raise FailedPrecondition("this replica serves no run actions (no API services)")
        return self.services.runs

    async def confirm(self, request: Request) -> Response:
        """What the action will do to this run, and the form that does it."""
        row = await self._run(request)
        action = self._action(request)
        q = request.query_params
        from_seq = q.get("from_seq", "")
        if action.name == "fork":
            last = row.step_count - (2 if row.status in TERMINAL else 1)  # before a finish
            from_seq = str(_seq("from_seq", from_seq or str(max(last, 0))))
        return render(
            request,
            "action.html",
            run=row,
            action=action,
            allowed=access.allows(action.need, request.state.who),
            from_seq=from_seq,
            ended=row.status in TERMINAL,
            signal_event=uuid.uuid4().hex,
        )

    def act(self, name: str) -> Callable[[Request], Awaitable[Response]]:
        """The POST handler of one action (its route carries the role it needs)."""

        async def handler(request: Request) -> Response:
            return await self._act(ACTIONS[name], request)

        handler.__name__ = f"act_{name}"
        return handler

    async def _act(self, action: Action, request: Request) -> Response:
        row = await self._run(request)
        form = request.state.form
        ws, run_id = row.workspace_id, str(row.run_id)
        if action.name == "cancel":
            reason = validate.text("reason", form.get("reason", ""), max_bytes=1000)
            req = run_pb2.CancelRunRequest(
                workspace_id=ws, run_id=run_id, reason=reason or "cancelled from the console"
            )
            await self._runs().CancelRun(req, cast(Any, None))
            return see_other(f"/console/runs/{run_id}")
        if action.name in ("fork", "retry"):
            seq = 0 if action.name == "retry" else _seq("from_seq", form.get("from_seq", ""))
            version = form.get("agent_version", "").strip()
            if version and not version.isdigit():
                raise InvalidArgument("agent_version", "must be a version number (or empty)")
            fork = run_pb2.ForkRunRequest(
                workspace_id=ws, run_id=run_id, from_seq=seq, agent_version=int(version or 0)
            )
            forked = await self._runs().ForkRun(fork, cast(Any, None))
            return see_other(f"/console/runs/{forked.run.run_id}")
        if action.name == "signal":
            sig = run_pb2.SignalRunRequest(
                workspace_id=ws,
                run_id=run_id,
                signal_name=form.get("signal_name", ""),
                event_id=form.get("event_id", ""),
                payload_json=form.get("payload_json", ""),
            )
            await self._runs().SignalRun(sig, cast(Any, None))
            return see_other(f"/console/runs/{run_id}")
        to = form.get("release", "").strip()
        move = release_store.Move(
            ws, row.run_id, release_name("release", to) if to else None, _label(), ""
        )
        try:
            await release_store.move(self.c.pool, move)
        except release_store.NotMovable as exc:
            raise FailedPrecondition(
                f"run {run_id} is {exc}: only a queued or waiting run moves"
            ) from None
        self.c.on_runnable()
        return see_other(f"/console/runs/{run_id}")


def _label() -> str:
    return auth_context.current().label


def _seq(field: str, value: str) -> int:
    value = value.strip()
    if not value.isascii() or not value.isdigit() or int(value) >= 2**31:
        raise InvalidArgument(field, "must be a step number (0 or more)")
    return int(value)


BULK_MAX = 500  # runs one press cancels; press again for more
OPEN = ("queued", "running", "waiting")


class BulkPages:
    """Cancel every unfinished run a filtered list shows (up to BULK_MAX a press): a GET
    confirmation that counts them and names the first few, then the POST."""

    def __init__(self, console: Console, services: Services | None) -> None:
        self.c = console
        self.services = services

    async def _open_runs(self, q: dict[str, str], limit: int) -> list[run_store.Run]:
        f = run_filter(q)
        if f.status and f.status not in OPEN:
            return []
        ws = auth_context.workspace("")
        out: list[run_store.Run] = []
        cursor = None
        while len(out) < limit:
            page = await console_store.search_runs(
                self.c.pool, ws, f, 200, cursor, reader=privacy.reader()
            )
            out += [p.run for p in page if p.run.status in OPEN]
            if len(page) < 200:
                break
            cursor = (page[-1].run.created_at, page[-1].run.run_id)
        return out[:limit]

    async def confirm(self, request: Request) -> Response:
        q = dict(request.query_params)
        runs = await self._open_runs(q, BULK_MAX + 1)
        kept = {k: v for k, v in q.items() if k in FILTERS and v}
        return render(
            request,
            "bulk.html",
            runs=runs[:BULK_MAX],
            more=len(runs) > BULK_MAX,
            shown=runs[:20],
            kept=kept,
            query=urlencode(kept),
            allowed=access.allows(Need.OPERATE, request.state.who),
            bulk_max=BULK_MAX,
        )

    async def cancel(self, request: Request) -> Response:
        form = request.state.form
        q = {k: v for k, v in form.items() if k in FILTERS}
        reason = validate.text("reason", form.get("reason", ""), max_bytes=1000)
        if self.services is None:
            raise FailedPrecondition("this replica serves no run actions (no API services)")
        cancelled = 0
        for row in await self._open_runs(q, BULK_MAX):
            req = run_pb2.CancelRunRequest(
                workspace_id=row.workspace_id,
                run_id=str(row.run_id),
                reason=reason or "cancelled from the console (bulk)",
            )
            try:
                await self.services.runs.CancelRun(req, cast(Any, None))
                cancelled += 1
            except FailedPrecondition:  # it ended meanwhile
                continue
        kept = {k: v for k, v in q.items() if v}
        return see_other(f"/console/runs?{urlencode({**kept, 'cancelled': str(cancelled)})}")
