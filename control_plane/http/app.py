"""Assembles the HTTP ingress app: every route module's routes behind one error mapping.

A route module exposes `routes(ctx: HttpContext) -> list[Route]` and raises
domain errors (mapped by `errors.json_errors`). To add one, import it here and
add its routes to `ROUTE_MODULES`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from control_plane.http import (
    api,
    connections,
    observability,
    openapi,
    sessions,
    streams,
    webhooks,
)
from control_plane.http.approvals import ApprovalRoutes
from control_plane.http.console import routes as console
from control_plane.http.context import HttpContext


def _approval_routes(ctx: HttpContext) -> list[Route]:
    """Approval links, signed-in decisions and Slack buttons (control_plane/http/approvals.py)."""
    return ApprovalRoutes(ctx.pool, ctx.config, ctx.verifier, ctx.credentials()).routes()


ROUTE_MODULES: tuple[Callable[[HttpContext], Sequence[BaseRoute]], ...] = (
    webhooks.routes,
    sessions.routes,
    _approval_routes,
    connections.routes,
    observability.routes,
    console.routes,  # the web console under /console/ (control_plane/http/console/)
    streams.routes,  # Durable Streams under /v1/workspaces/{id}/streams/ (control_plane/http/streams.py)
    api.routes,  # the HTTP/JSON API under /v1/workspaces/ (control_plane/http/api.py)
    lambda ctx: openapi.routes(),  # its OpenAPI document, GET /v1/openapi.json
)


async def healthz(request: Request) -> Response:
    """Liveness: the process serves. Readiness (the database answers) is /readyz."""
    return JSONResponse({"status": "ok"})


class ApiCors:
    """CORS for the HTTP/JSON API only (/v1/), for the origins AGENTRUN_HTTP_CORS_ORIGINS
    names: a page there may call it with a bearer credential (never cookies); the console,
    webhooks and approval links answer no other origin."""

    def __init__(self, app: ASGIApp, origins: tuple[str, ...]) -> None:
        self.app = app
        self.cors = CORSMiddleware(
            app,
            allow_origins=list(origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID"],
            max_age=600,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            await self.cors(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def build_app(ctx: HttpContext, extra: Iterable[BaseRoute] = ()) -> Starlette:
    """The ingress app with every module's routes (and `extra`, for tests)."""
    routes: list[BaseRoute] = [Route("/healthz", healthz, methods=["GET"])]
    for module_routes in ROUTE_MODULES:
        routes += list(module_routes(ctx))
    routes += list(extra)
    routes.append(openapi.fallback())  # the rest of /v1/: problem details, never text
    app = Starlette(routes=routes)
    if ctx.config.http_cors_origins:
        app.add_middleware(ApiCors, origins=ctx.config.http_cors_origins)
    return app
