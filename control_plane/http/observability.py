"""`/metrics` (Prometheus, authenticated) and `/readyz` (readiness) on the HTTP ingress.

`/metrics` answers a caller with `AGENTRUN_METRICS_TOKEN` as its bearer token (a
scrape-only secret; works while Postgres is down) or a platform key; its labels name
workspaces, so no other credential may read it (control_plane/ops/metrics.py).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from control_plane.auth.principal import Kind
from control_plane.auth.resolver import bearer
from control_plane.ground.errors import PermissionDenied
from control_plane.http.context import HttpContext
from control_plane.http.errors import json_errors
from control_plane.ops import metrics
from control_plane.ops.readiness import Readiness


def routes(ctx: HttpContext) -> list[Route]:
    readiness = ctx.readiness or Readiness(ctx.pool)
    exposition = metrics.Exposition(ctx.pool)

    async def readyz(request: Request) -> Response:
        if await readiness.ready():
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "unready", "database": "unreachable"}, status_code=503)

    @json_errors
    async def scrape(request: Request) -> Response:
        header = request.headers.get("authorization")
        if not metrics.token_matches(ctx.config.metrics_token, bearer(header) or ""):
            who = await ctx.credentials().resolve(header)
            if who.kind is not Kind.PLATFORM:
                raise PermissionDenied(
                    "metrics need the scrape token (AGENTRUN_METRICS_TOKEN) or a platform key"
                )
        body = await exposition.render()
        return Response(body, media_type=metrics.CONTENT_TYPE_LATEST)

    return [
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", scrape, methods=["GET"]),
    ]
