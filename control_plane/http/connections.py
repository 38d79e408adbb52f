"""Connecting accounts over HTTP: the start link and the OAuth callback.

* ``GET /connections/{workspace_id}/{provider}/start`` — for a key holder with OPERATE in
  the workspace (``Authorization: Bearer``): 302 to the provider's authorize URL, with a
  state and a PKCE challenge whose verifier stays here (sealed). Query: ``scope`` (space
  separated, default ``{provider}:read {provider}:write``), ``login_hint``, and
  ``connection_id`` for a reconnect link. The caller becomes the connection's owner.
* ``GET /connections/callback`` — where the provider sends the browser back: the state is
  consumed once, the code exchanged, the tokens sealed. Answers the connection (never a
  token); runs parked on a reconnected connection are woken.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from control_plane.auth import context as auth_context
from control_plane.auth.access import Need
from control_plane.connections.flows import CALLBACK_PATH, ConnectionFlows, default_scopes
from control_plane.ground import validate
from control_plane.ground.errors import InvalidArgument
from control_plane.http.auth import guarded
from control_plane.http.context import HttpContext
from control_plane.http.errors import json_errors

START_PATH = "/connections/{workspace_id}/{provider}/start"


def routes(ctx: HttpContext) -> list[Route]:
    flows = ctx.connections
    if flows is None:
        return []

    async def start(request: Request) -> Response:
        ws = auth_context.workspace(request.path_params["workspace_id"])
        provider = str(request.path_params["provider"])
        q = request.query_params
        scopes = q.get("scope", "").split() or default_scopes(provider)
        connection_id = q.get("connection_id") or None
        if connection_id is not None:
            connection_id = str(validate.run_id("connection_id", connection_id))
        url = await flows.start(
            ws,
            provider,
            auth_context.current().label,
            scopes,
            connection_id=connection_id,
            login_hint=q.get("login_hint", "")[:320],
        )
        return RedirectResponse(url, status_code=302)

    async def callback(request: Request) -> Response:
        response, woken = await _callback(flows, request)
        if woken:
            ctx.on_runnable()  # runs parked on the connection are due now
        return response

    guarded_start = guarded(ctx.credentials(), Need.OPERATE, start)
    return [
        Route(START_PATH, json_errors(guarded_start), methods=["GET"]),
        Route(CALLBACK_PATH, json_errors(callback), methods=["GET"]),
    ]


async def _callback(flows: ConnectionFlows, request: Request) -> tuple[Response, bool]:
    q = request.query_params
    if q.get("error"):
        raise InvalidArgument("error", "the provider did not grant access")
    state, code = q.get("state", ""), q.get("code", "")
    if not state:
        raise InvalidArgument("state", "is required")
    if not code:
        raise InvalidArgument("code", "is required")
    done = await flows.finish(state, code)
    return JSONResponse(
        {
            "workspace_id": done.workspace_id,
            "connection_id": done.connection_id,
            "provider": done.provider,
            "account": done.account,
            "scopes": list(done.scopes),
            "status": "active",
            "reconnected": done.reconnected,
            "woken_runs": len(done.woken),
        }
    ), bool(done.woken)
