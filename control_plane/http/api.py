"""The HTTP/JSON API: the gRPC methods a client calls, transcoded, from one table (docs/api.md).

Each `Op` of `OPS` names a gRPC method and where its request's fields come from: the path
(`{run_id}`), the query string (GET) or a JSON body (POST). A request builds that method's
request message (jsonmap.fill: strict, INVALID_ARGUMENT naming the field), calls the very
servicer method the gRPC server serves, as the caller (`guarded`, with the capability
`access.ACCESS` gives the method), and answers the response message as JSON (jsonmap.to_json).
Errors are problem details (problems.py). The same table writes the OpenAPI document
(openapi.py), so a route and its description cannot drift apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

from google.protobuf.message import Message
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agentrun.v1 import agent_pb2, approval_pb2, run_pb2, session_pb2
from control_plane.auth import access
from control_plane.ground import validate
from control_plane.ground.errors import InvalidArgument
from control_plane.http import jsonmap
from control_plane.http.auth import guarded
from control_plane.http.context import HttpContext
from control_plane.http.problems import from_exception, problem, problem_errors
from control_plane.http.services import Services
from control_plane.http.webhooks import TooLarge, read_body

PREFIX = "/v1/workspaces/{workspace_id}/"
MAX_BODY_BYTES = validate.MAX_JSON_BYTES
_PARAM = re.compile(r"{([a-z_]+)}")
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class Op:
    """One route: `method` `PREFIX + path` serves gRPC `rpc` (Service/Method)."""

    method: str
    path: str
    rpc: str
    summary: str
    request: type[Message]
    response: type[Message]
    # Answer this field of the response alone (GetRun's `run`), not the whole response.
    unwrap: str = ""
    # A bool field of the response: 201 when true, else 200 (StartRun's `created`).
    created: str = ""
    # The success status when `created` is not set.
    status: int = 200
    # Body fields that must be there.
    required: tuple[str, ...] = ()
    # Tighter integer bounds than the field's type, as the servicer checks them.
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    # Body fields that take any JSON value: a string as is, anything else as its JSON text.
    any_json: tuple[str, ...] = ()
    # What the document says of a field beyond its type, as the servicer checks it.
    extra: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Served as text/event-stream (WatchRun): see `_watch`.
    stream: bool = False
    # Served by another module (its document entry is written by openapi.py).
    elsewhere: bool = False

    @property
    def full_path(self) -> str:
        return PREFIX + self.path

    @property
    def path_fields(self) -> tuple[str, ...]:
        return tuple(_PARAM.findall(self.full_path))

    @property
    def need(self) -> access.Need:
        return access.ACCESS[f"/agentrun.v1.{self.rpc}"]

    @property
    def operation_id(self) -> str:
        return self.rpc.split("/")[1]

    @property
    def skip(self) -> frozenset[str]:
        return frozenset(self.path_fields)


_PAGE_500 = {"page_size": (0, 500)}
SLUG = {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,62}$"}
_NON_NEGATIVE = (0, INT32_MAX)

OPS: tuple[Op, ...] = (
    Op(
        "POST",
        "runs",
        "RunService/StartRun",
        "Start a run (idempotent by request_id or the Idempotency-Key header)",
        run_pb2.StartRunRequest,
        run_pb2.StartRunResponse,
        unwrap="run",
        created="created",
        required=("agent_id", "input"),
        ranges={"priority": (-100, 100), "agent_version": _NON_NEGATIVE},
        any_json=("input",),
        extra={"agent_id": SLUG},
    ),
    Op(
        "GET",
        "runs",
        "RunService/ListRuns",
        "List the workspace's runs, newest first",
        run_pb2.ListRunsRequest,
        run_pb2.ListRunsResponse,
        ranges=_PAGE_500,
    ),
    Op(
        "GET",
        "runs/{run_id}",
        "RunService/GetRun",
        "Get a run",
        run_pb2.GetRunRequest,
        run_pb2.GetRunResponse,
        unwrap="run",
    ),
    Op(
        "POST",
        "runs/{run_id}/cancel",
        "RunService/CancelRun",
        "Cancel a run",
        run_pb2.CancelRunRequest,
        run_pb2.CancelRunResponse,
        unwrap="run",
    ),
    Op(
        "POST",
        "runs/{run_id}/pause",
        "RunService/PauseRun",
        "Pause a run: it parks at its next step boundary until resumed",
        run_pb2.PauseRunRequest,
        run_pb2.PauseRunResponse,
        unwrap="run",
    ),
    Op(
        "POST",
        "runs/{run_id}/resume",
        "RunService/ResumeRun",
        "Resume a paused run",
        run_pb2.ResumeRunRequest,
        run_pb2.ResumeRunResponse,
        unwrap="run",
    ),
    Op(
        "POST",
        "runs/{run_id}/fork",
        "RunService/ForkRun",
        "Fork a run from one of its steps",
        run_pb2.ForkRunRequest,
        run_pb2.ForkRunResponse,
        unwrap="run",
        status=201,
        ranges={
            "priority": (-100, 100),
            "from_seq": _NON_NEGATIVE,
            "agent_version": _NON_NEGATIVE,
        },
    ),
    Op(
        "POST",
        "runs/{run_id}/signals",
        "RunService/SignalRun",
        "Send a signal to a run (idempotent by event_id)",
        run_pb2.SignalRunRequest,
        run_pb2.SignalRunResponse,
        created="created",
        required=("signal_name", "event_id"),
        extra={
            "signal_name": {"pattern": "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"},
            "event_id": {"minLength": 1},
        },
    ),
    Op(
        "POST",
        "events",
        "RunService/PublishEvent",
        "Publish an event: wakes the runs waiting for it (idempotent by event_id)",
        run_pb2.PublishEventRequest,
        run_pb2.PublishEventResponse,
        created="created",
        required=("event_name", "event_id", "body"),
        extra={
            "event_name": {"pattern": "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"},
            "event_id": {"minLength": 1},
        },
    ),
    Op(
        "GET",
        "runs/{run_id}/steps",
        "RunService/ListRunSteps",
        "List a run's steps in order",
        run_pb2.ListRunStepsRequest,
        run_pb2.ListRunStepsResponse,
        ranges={"page_size": (0, 1000), "from_seq": _NON_NEGATIVE},
    ),
    Op(
        "GET",
        "runs/{run_id}/watch",
        "RunService/WatchRun",
        "Watch a run: its state and steps as server-sent events until it ends",
        run_pb2.WatchRunRequest,
        run_pb2.WatchRunResponse,
        stream=True,
    ),
    Op(
        "POST",
        "runs/{run_id}/unknown-outcomes/{seq}/resolve",
        "RunService/ResolveUnknownOutcome",
        "Decide a tool call whose outcome is unknown",
        run_pb2.ResolveUnknownOutcomeRequest,
        run_pb2.ResolveUnknownOutcomeResponse,
        required=("decision",),
        ranges={"seq": (1, INT32_MAX)},
    ),
    Op(
        "GET",
        "approvals",
        "ApprovalService/ListApprovals",
        "List the workspace's approvals, newest first",
        approval_pb2.ListApprovalsRequest,
        approval_pb2.ListApprovalsResponse,
        ranges=_PAGE_500,
    ),
    Op(
        "GET",
        "approvals/{approval_id}",
        "ApprovalService/GetApproval",
        "Get an approval with the exact arguments it covers",
        approval_pb2.GetApprovalRequest,
        approval_pb2.GetApprovalResponse,
        unwrap="approval",
    ),
    Op(
        "POST",
        "approvals/{approval_id}/decision",
        "ApprovalService/DecideApproval",
        "Approve, reject or edit a pending approval, as the caller",
        approval_pb2.DecideApprovalRequest,
        approval_pb2.DecideApprovalResponse,
        unwrap="approval",
    ),
    Op(
        "POST",
        "sessions",
        "SessionService/CreateSession",
        "Open a conversation with an agent",
        session_pb2.CreateSessionRequest,
        session_pb2.CreateSessionResponse,
        unwrap="session",
        status=201,
        required=("agent_id",),
        extra={"agent_id": SLUG},
    ),
    Op(
        "GET",
        "sessions",
        "SessionService/ListSessions",
        "List the workspace's sessions, newest first",
        session_pb2.ListSessionsRequest,
        session_pb2.ListSessionsResponse,
        ranges=_PAGE_500,
        extra={"agent_id": SLUG},
    ),
    Op(
        "GET",
        "sessions/{session_id}",
        "SessionService/GetSession",
        "Get a session and its latest turn",
        session_pb2.GetSessionRequest,
        session_pb2.GetSessionResponse,
        unwrap="session",
    ),
    Op(
        "GET",
        "sessions/{session_id}/turns",
        "SessionService/ListTurns",
        "List a session's turns in order",
        session_pb2.ListTurnsRequest,
        session_pb2.ListTurnsResponse,
        ranges={"page_size": (0, 500), "from_turn": _NON_NEGATIVE},
    ),
    Op(
        "POST",
        "sessions/{session_id}/messages",
        "SessionService/SendMessage",
        "Send the session's next message (control_plane/http/sessions.py)",
        session_pb2.SendMessageRequest,
        session_pb2.SendMessageResponse,
        elsewhere=True,
    ),
    Op(
        "POST",
        "sessions/{session_id}/members",
        "SessionService/UpdateSessionMembers",
        "Add or remove a session's members, or change its visibility (docs/sessions.md)",
        session_pb2.UpdateSessionMembersRequest,
        session_pb2.UpdateSessionMembersResponse,
        unwrap="session",
    ),
    Op(
        "GET",
        "agents",
        "AgentService/ListAgents",
        "List the workspace's agents by id",
        agent_pb2.ListAgentsRequest,
        agent_pb2.ListAgentsResponse,
        ranges=_PAGE_500,
    ),
    Op(
        "GET",
        "agents/{agent_id}",
        "AgentService/GetAgent",
        "Get an agent",
        agent_pb2.GetAgentRequest,
        agent_pb2.GetAgentResponse,
        unwrap="agent",
    ),
    Op(
        "GET",
        "agents/{agent_id}/versions/{version}",
        "AgentService/GetAgentVersion",
        "Get a published version of an agent (0: the latest)",
        agent_pb2.GetAgentVersionRequest,
        agent_pb2.GetAgentVersionResponse,
        unwrap="version",
        ranges={"version": _NON_NEGATIVE},
    ),
)

# WatchRun's query parameters (its own, not the request message's): see `_watch`.
WATCH_QUERY = ("after_seq", "deltas")
IDEMPOTENCY_KEY = "Idempotency-Key"
KEEP_ALIVE_SECONDS = 15.0
LAST_EVENT_ID = "Last-Event-ID"


# --- building a request -----------------------------------------------------------------------


def _field(op: Op, name: str) -> Any:
    return op.request.DESCRIPTOR.fields_by_name[name]


def _checked(op: Op, name: str, value: Any, where: str) -> None:
    bounds = op.ranges.get(name)
    if bounds is not None and isinstance(value, int) and not bounds[0] <= value <= bounds[1]:
        raise InvalidArgument(where, f"must be between {bounds[0]} and {bounds[1]}")


def _from_path(op: Op, msg: Message, request: Request) -> None:
    for name in op.path_fields:
        raw = str(request.path_params[name])
        value = jsonmap.query_value(_field(op, name), raw, name)
        _checked(op, name, value, name)
        jsonmap.fill(msg, {name: value}, skip=frozenset())


def _from_query(op: Op, msg: Message, request: Request) -> None:
    allowed = {
        jsonmap.json_name(f): f
        for f in op.request.DESCRIPTOR.fields
        if f.name not in op.skip and not f.GetOptions().deprecated
    }
    values: dict[str, Any] = {}
    for key, raw in request.query_params.multi_items():
        f = allowed.get(key)
        if f is None:
            raise InvalidArgument(key, "is not a query parameter of this request")
        if key in values:
            raise InvalidArgument(key, "is given more than once")
        values[key] = jsonmap.query_value(f, raw, key)
        _checked(op, f.name, values[key], key)
    jsonmap.fill(msg, values, skip=op.skip)


async def _from_body(op: Op, msg: Message, request: Request) -> None:
    try:
        raw = await read_body(request, MAX_BODY_BYTES)
    except TooLarge:
        raise InvalidArgument("body", f"is larger than {MAX_BODY_BYTES} bytes") from None
    body = validate.json_value("body", raw or b"{}", max_bytes=MAX_BODY_BYTES)
    if not isinstance(body, dict):
        raise InvalidArgument("body", "must be a JSON object")
    for name in op.any_json:
        if name in body and not isinstance(body[name], str):
            body[name] = json.dumps(body[name], ensure_ascii=False, separators=(",", ":"))
    for name in op.required:
        if name not in body:
            raise InvalidArgument(name, "is required")
    jsonmap.fill(msg, body, skip=op.skip)
    for name, value in body.items():
        _checked(op, name, value, name)


def _idempotency(msg: run_pb2.StartRunRequest, request: Request) -> None:
    """StartRun's `Idempotency-Key` header: the request_id, unless the body names another."""
    key = request.headers.get(IDEMPOTENCY_KEY.lower())
    if key is None:
        return
    if not 1 <= len(key) <= 200:
        raise InvalidArgument(IDEMPOTENCY_KEY, "must be 1-200 characters")
    if msg.request_id and msg.request_id != key:
        raise InvalidArgument("request_id", f"differs from the {IDEMPOTENCY_KEY} header")
    msg.request_id = key


async def request_message(op: Op, request: Request) -> Message:
    """The gRPC request `op`'s HTTP request stands for (INVALID_ARGUMENT naming a field)."""
    msg = op.request()
    _from_path(op, msg, request)
    if op.method == "GET":
        _from_query(op, msg, request)
    else:
        await _from_body(op, msg, request)
    if isinstance(msg, run_pb2.StartRunRequest):
        _idempotency(msg, request)
    return msg


def answer(op: Op, response: Message) -> Response:
    status = op.status
    if op.created:
        status = 201 if getattr(response, op.created) else 200
    body = jsonmap.to_json(getattr(response, op.unwrap) if op.unwrap else response)
    return JSONResponse(body, status_code=status)


# --- WatchRun as server-sent events -----------------------------------------------------------


def _event_seq(raw: str, where: str) -> int:
    text = raw.strip()
    if not re.fullmatch(r"[0-9]{1,10}", text) or int(text) >= INT32_MAX:
        raise InvalidArgument(where, f"must be a step seq (0-{INT32_MAX - 1})")
    return int(text)


def _watch_request(request: Request) -> run_pb2.WatchRunRequest:
    msg = run_pb2.WatchRunRequest(
        workspace_id=str(request.path_params["workspace_id"]),
        run_id=str(request.path_params["run_id"]),
    )
    for key, raw in request.query_params.multi_items():
        if key not in WATCH_QUERY:
            raise InvalidArgument(key, "is not a query parameter of this request")
        if key == "after_seq":
            msg.from_seq = _event_seq(raw, key) + 1
        elif raw in ("true", "false"):
            msg.deltas = raw == "true"
        else:
            raise InvalidArgument(key, "must be true or false")
    last = request.headers.get(LAST_EVENT_ID.lower())
    if last is not None:  # a reconnecting EventSource: after the last event it got
        msg.from_seq = _event_seq(last, LAST_EVENT_ID) + 1
    return msg


def sse(item: run_pb2.WatchRunResponse) -> str:
    """One event: `step` (id = its seq), `run` or `delta`, data the projection."""
    kind = item.WhichOneof("event") or "run"
    data = json.dumps(jsonmap.to_json(getattr(item, kind)), separators=(",", ":"))
    event_id = f"id: {item.step.seq}\n" if kind == "step" else ""
    return f"event: {kind}\n{event_id}data: {data}\n\n"


async def _kept_alive(
    feed: AsyncGenerator[run_pb2.WatchRunResponse, None],
) -> AsyncIterator[str]:
    """The feed's events, and a comment line whenever it is quiet for KEEP_ALIVE_SECONDS (a
    run waiting hours for an approval), so proxies keep the connection open. The next item
    is awaited in a task of its own: a timeout cancels the wait, never the feed."""
    while True:
        pending = asyncio.ensure_future(anext(feed))
        try:
            while not pending.done():
                await asyncio.wait({pending}, timeout=KEEP_ALIVE_SECONDS)
                if not pending.done():
                    yield ": keep-alive\n\n"
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
        finally:
            if not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await pending
        yield sse(item)


async def _watch(services: Services, request: Request) -> Response:
    """The run's events; the first is read here, so a bad request or an unknown run is a
    problem answer, not a stream. The feed reads no caller context after its first event."""
    feed = cast(
        AsyncGenerator[run_pb2.WatchRunResponse, None],
        services.runs.WatchRun(_watch_request(request), cast(Any, None)),
    )
    try:
        first: run_pb2.WatchRunResponse | None = await anext(feed)
    except StopAsyncIteration:
        first = None
    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    if request.method == "HEAD":  # the answer a GET would start with, no stream held open
        await feed.aclose()
        return Response(status_code=200, media_type="text/event-stream", headers=headers)

    async def events() -> AsyncIterator[str]:
        try:
            if first is not None:
                yield sse(first)
            async for text in _kept_alive(feed):
                yield text
            yield "event: end\ndata: {}\n\n"
        except Exception as exc:  # noqa: BLE001 - the stream has started: say it in the stream
            yield f"event: error\ndata: {bytes(from_exception(exc).body).decode()}\n\n"
        finally:
            await feed.aclose()

    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)


# --- routes -----------------------------------------------------------------------------------


Handler = Callable[[Request], Awaitable[Response]]


def handler(op: Op, services: Services) -> Handler:
    """`op` served: the request built, the servicer method called, the answer projected."""
    if op.stream:

        async def stream(request: Request) -> Response:
            return await _watch(services, request)

        return stream

    method = services.method(op.rpc)

    async def serve(request: Request) -> Response:
        msg = await request_message(op, request)
        return answer(op, await method(msg, None))

    return serve


def _by_method(handlers: dict[str, Handler]) -> Handler:
    allow = ", ".join(sorted(handlers))

    async def dispatch(request: Request) -> Response:
        method = "GET" if request.method == "HEAD" else request.method
        chosen = handlers.get(method)
        if chosen is None:
            return problem(405, f"{request.method} is not served here", headers={"Allow": allow})
        return await chosen(request)

    return dispatch


def routes(ctx: HttpContext) -> list[Route]:
    """Every route of OPS served by this module, one Route per path (405 names the others).
    None without the gRPC server's servicers (`ctx.services`): the API serves only those."""
    if ctx.services is None:
        return []
    services = cast(Services, ctx.services)
    resolver = ctx.credentials()
    by_path: dict[str, dict[str, Handler]] = {}
    for op in OPS:
        if op.elsewhere:
            continue
        served = problem_errors(guarded(resolver, op.need, handler(op, services)))
        by_path.setdefault(op.full_path, {})[op.method] = served
    return [
        Route(path, _by_method(handlers), methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"])
        for path, handlers in by_path.items()
    ]
