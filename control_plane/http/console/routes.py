"""The console's routes, mounted at /console on the HTTP ingress (control_plane/http/app.py)."""

from __future__ import annotations

from pathlib import Path

from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from control_plane.auth.access import Need
from control_plane.http.console.actions import ACTIONS, ActionPages, BulkPages
from control_plane.http.console.approvals import ApprovalPages
from control_plane.http.console.charts import ChartPages
from control_plane.http.console.objects import ObjectPages
from control_plane.http.console.oidc_flow import CodeFlow
from control_plane.http.console.runs import RunPages
from control_plane.http.console.sessions import Sessions
from control_plane.http.console.signin import SignInPages
from control_plane.http.console.web import PREFIX, Console
from control_plane.http.console.workspace import WorkspacePages
from control_plane.http.context import HttpContext

STATIC = Path(__file__).parent / "static"


def console_of(ctx: HttpContext) -> Console:
    resolver = ctx.credentials()
    flow = CodeFlow(ctx.verifier, resolver) if ctx.verifier is not None else None
    return Console(
        ctx.pool, ctx.config, resolver, Sessions(ctx.pool, resolver), flow, ctx.on_runnable
    )


def routes(ctx: HttpContext) -> list[BaseRoute]:
    c = console_of(ctx)
    runs, approvals = RunPages(c), ApprovalPages(c)
    workspace, signin = WorkspacePages(c), SignInPages(c)
    actions, objects = ActionPages(c, ctx.services), ObjectPages(c)
    bulk = BulkPages(c, ctx.services)
    get, post = ["GET"], ["POST"]
    pages = [
        Route("/", c.page(Need.READ, runs.index), methods=get),
        Route("/runs", c.page(Need.READ, runs.runs), methods=get),
        Route("/runs/live", c.page(Need.READ, runs.live), methods=get),
        Route("/runs/bulk/cancel", c.page(Need.READ, bulk.confirm), methods=get),
        Route("/runs/bulk/cancel", c.page(Need.OPERATE, bulk.cancel), methods=post),
        Route("/runs/{run_id}", c.page(Need.READ, runs.run), methods=get),
        Route("/runs/{run_id}/events", c.page(Need.READ, runs.events), methods=get),
        Route(
            "/runs/{run_id}/unknowns/{seq:int}", c.page(Need.OPERATE, runs.resolve), methods=post
        ),
        Route("/runs/{run_id}/actions/{action}", c.page(Need.READ, actions.confirm), methods=get),
        *(
            Route(
                f"/runs/{{run_id}}/actions/{name}", c.page(a.need, actions.act(name)), methods=post
            )
            for name, a in ACTIONS.items()
        ),
        Route("/unknowns", c.page(Need.READ, runs.unknowns), methods=get),
        Route("/approvals", c.page(Need.READ, approvals.inbox), methods=get),
        Route("/approvals/{approval_id}", c.page(Need.READ, approvals.show), methods=get),
        Route("/approvals/{approval_id}", c.page(Need.DECIDE, approvals.decide), methods=post),
        Route("/queue", c.page(Need.READ, workspace.queue), methods=get),
        Route("/charts", c.page(Need.READ, ChartPages(c).charts), methods=get),
        Route("/sessions", c.page(Need.READ, objects.sessions), methods=get),
        Route("/sessions/{session_id}", c.page(Need.READ, objects.session), methods=get),
        Route("/agents", c.page(Need.READ, objects.agents), methods=get),
        Route("/agents/{agent_id}", c.page(Need.READ, objects.agent), methods=get),
        Route("/tools", c.page(Need.READ, objects.tools), methods=get),
        Route("/connections", c.page(Need.READ, objects.connections), methods=get),
        Route("/releases", c.page(Need.READ, objects.releases), methods=get),
        Route("/credits", c.page(Need.READ, objects.credits), methods=get),
        Route("/triggers", c.page(Need.READ, workspace.triggers), methods=get),
        Route("/signin", signin.form, methods=get),
        Route("/signin/key", signin.with_key, methods=post),
        Route("/signin/oidc", signin.with_oidc, methods=post),
        Route("/callback", signin.callback, methods=get),
        Route("/signout", c.page(Need.READ, signin.sign_out), methods=post),
        Mount("/static", StaticFiles(directory=STATIC), name="console-static"),
    ]
    return [Mount(PREFIX, routes=pages)]
