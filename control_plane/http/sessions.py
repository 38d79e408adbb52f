"""POST /v1/workspaces/{workspace_id}/sessions/{session_id}/messages: the next turn, or 409.

The HTTP door to `Conversations.send` (the gRPC one is SessionService.SendMessage).
Body `{"text": "...", "request_id": "...", "strategy": "enqueue", "priority": 5}`
(request_id, strategy and priority optional; strategy one of reject, enqueue, interrupt,
rollback, default the session's; priority the turn's run's, -100..100, default 0). 202
with the turn and its run (and its priority); 409 while the previous turn is still in progress; 400 naming
the field for bad input; 404 for an unknown session. It needs a key with
OPERATE in the path's workspace (`Authorization: Bearer`): 401 without one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from control_plane.api.sessions import STRATEGY_TO_PROTO, Conversations
from control_plane.auth import context as auth_context
from control_plane.auth.access import Need
from control_plane.ground import validate
from control_plane.ground.errors import InvalidArgument
from control_plane.http.auth import guarded
from control_plane.http.context import HttpContext
from control_plane.http.errors import json_errors
from control_plane.http.webhooks import TooLarge, read_body
from control_plane.store.admission import MAX_INPUT_BYTES

PATH = "/v1/workspaces/{workspace_id}/sessions/{session_id}/messages"


def _turn_json(row: Any, created: bool) -> dict[str, Any]:
    return {
        "turn": row["turn"],
        "run_id": str(row["run_id"]),
        "status": row["status"],
        "priority": row["priority"],
        "created": created,
    }


def _field(body: dict[str, Any], name: str) -> str:
    value = body.get(name, "")
    if not isinstance(value, str):
        raise InvalidArgument(name, "must be a string")
    return value


def _priority(body: dict[str, Any]) -> int:
    value = body.get("priority")
    if value is None:  # absent or null: the default
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument("priority", "must be an integer")
    return validate.priority("priority", value)


@dataclass(frozen=True)
class Message:
    text: str
    request_id: str | None
    strategy: str | None
    priority: int


async def _message(request: Request) -> Message:
    try:
        raw = await read_body(request, MAX_INPUT_BYTES + 4096)
    except TooLarge:
        raise InvalidArgument("text", f"is larger than {MAX_INPUT_BYTES} bytes") from None
    body = validate.json_value("body", raw or b"{}", max_bytes=len(raw))
    if not isinstance(body, dict):
        raise InvalidArgument("body", "must be a JSON object")
    text = validate.text("text", _field(body, "text"), max_bytes=MAX_INPUT_BYTES, required=True)
    request_id = validate.text("request_id", _field(body, "request_id"), max_bytes=200)
    strategy = _field(body, "strategy") or None
    if strategy is not None and strategy not in STRATEGY_TO_PROTO:
        raise InvalidArgument("strategy", f"must be one of {', '.join(STRATEGY_TO_PROTO)}")
    return Message(text, request_id or None, strategy, _priority(body))


def routes(ctx: HttpContext) -> list[Route]:
    conversations = Conversations(
        ctx.pool, ctx.config.defaults, ctx.on_runnable, fast=ctx.fast_path
    )

    async def send(request: Request) -> Response:
        ws = auth_context.workspace(request.path_params["workspace_id"])
        session_id = validate.run_id("session_id", request.path_params["session_id"])
        m = await _message(request)
        row, created = await conversations.send(
            ws, session_id, m.text, m.request_id, m.strategy, m.priority
        )
        return JSONResponse(_turn_json(row, created), status_code=202)

    guarded_send = guarded(ctx.credentials(), Need.OPERATE, send)
    return [Route(PATH, json_errors(guarded_send), methods=["POST"])]
