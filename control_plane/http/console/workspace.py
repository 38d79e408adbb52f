"""The workspace's queue (caps, running counts, waits) and its triggers with their events."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from control_plane.auth import context as auth_context
from control_plane.ground import validate
from control_plane.ground.errors import InvalidArgument, NotFound
from control_plane.http.console.web import Console, render
from control_plane.store import console as store
from control_plane.store import triggers as trigger_store
from control_plane.store import workspaces

EVENT_STATUSES = ("accepted", "filtered")
EVENTS_SHOWN = 50
# An executor seen this recently counts as connected (deploys/releases.py LIVE_SECONDS).
RELEASE_LIVE_SECONDS = 30.0


class WorkspacePages:
    def __init__(self, console: Console) -> None:
        self.c = console

    async def queue(self, request: Request) -> Response:
        ws = auth_context.workspace("")
        row = await workspaces.get(self.c.pool, ws)
        if row is None:
            raise NotFound(f"workspace {ws} not found")
        agents = await store.queue_by_agent(self.c.pool, ws)
        waits = await store.waits(self.c.pool, ws)
        rate_waits = sum(w["runs"] for w in waits if w["wait_reason"] == "rate")
        stranded = await store.release_waits(self.c.pool, ws, RELEASE_LIVE_SECONDS)
        return render(
            request,
            "queue.html",
            workspace={**dict(row), "next_wake_at": await workspaces.next_wake(self.c.pool, ws)},
            agents=agents,
            waits=waits,
            rate_waits=rate_waits,
            stranded=stranded,
        )

    async def triggers(self, request: Request) -> Response:
        ws = auth_context.workspace("")
        q = request.query_params
        chosen = validate.slug("trigger", q["trigger"]) if q.get("trigger") else None
        status = q.get("status", "")
        if status and status not in EVENT_STATUSES:
            raise InvalidArgument("status", "must be accepted or filtered")
        rows = await trigger_store.list_triggers(self.c.pool, ws, None, None, 200)
        events = {}
        for t in rows:
            if chosen and t["trigger_id"] != chosen:
                continue
            found = await trigger_store.list_events(
                self.c.pool, ws, t["trigger_id"], None, EVENTS_SHOWN
            )
            events[t["trigger_id"]] = [e for e in found if not status or e["status"] == status]
        return render(
            request,
            "triggers.html",
            triggers=rows,
            events=events,
            chosen=chosen,
            event_status=status,
        )
