"""The HTTP guard: `Authorization: Bearer <key or ID token>`, resolved as gRPC calls are.

Every route but /healthz, webhooks (their signatures authenticate them) and
approval links and Slack (capabilities) is wrapped in `guarded`. The shared
`Resolver` turns the header into a Principal; the route runs inside
`context.acting_as(principal)`, so it reads its workspace with
`context.workspace(path workspace_id)` just as a servicer does.
"""

from __future__ import annotations

import functools

from starlette.requests import Request
from starlette.responses import Response

from control_plane.auth import access, audit, context
from control_plane.auth.resolver import Resolver
from control_plane.ground.errors import PermissionDenied
from control_plane.http.errors import Handler


def guarded(resolver: Resolver, need: access.Need, handler: Handler) -> Handler:
    """`handler`, served only to a caller whose credential holds `need`.

    Raises domain errors (401, 403): wrap the result in `json_errors`.
    """

    @functools.wraps(handler)
    async def wrapper(request: Request) -> Response:
        with audit.request(audit.new_request_id(request.headers.get("x-request-id"))):
            workspace_id = str(request.path_params.get("workspace_id", ""))
            who = await resolver.resolve(request.headers.get("authorization"), workspace_id)
            if not access.allows(need, who):
                raise PermissionDenied(f"a {who.kind.value} credential may not {need.value} here")
            with context.acting_as(who):
                return await handler(request)

    return wrapper
