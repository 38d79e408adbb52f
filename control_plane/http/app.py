"""Assembles the HTTP ingress app: every route module's routes behind one error mapping.

A route module exposes `routes(ctx: HttpContext) -> list[Route]` and raises
domain errors (mapped by `errors.json_errors`). To add one, import it here and
add its routes to `ROUTE_MODULES`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from control_plane.http import api, connections, observability, openapi, sessions, webhooks
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
    api.routes,  # the HTTP/JSON API under /v1/workspaces/ (control_plane/http/api.py)
    lambda ctx: openapi.routes(),  # its OpenAPI document, GET /v1/openapi.json
)


async def healthz(request: Request) -> Response:
    """Liveness: the process serves. Readiness (the database answers) is /readyz."""
    return JSONResponse({"status": "ok"})


def build_app(ctx: HttpContext, extra: Iterable[BaseRoute] = ()) -> Starlette:
    """The ingress app with every module's routes (and `extra`, for tests)."""
    routes: list[BaseRoute] = [Route("/healthz", healthz, methods=["GET"])]
    for module_routes in ROUTE_MODULES:
        routes += list(module_routes(ctx))
    routes += list(extra)
    routes.append(openapi.fallback())  # the rest of /v1/: problem details, never text
    return Starlette(routes=routes)
