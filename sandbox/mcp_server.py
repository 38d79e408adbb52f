"""A sandbox remote MCP server (the `mcp` SDK, streamable HTTP): a small ticket desk.

Tools, with the annotations a registry sync reads:

* ``list_tickets`` (readOnlyHint): the tickets, optionally by status;
* ``create_ticket`` (destructiveHint, no dedupe: every call opens a new ticket,
  so an unknown outcome can only go to a person — class ``none``);
* ``add_note`` (idempotentHint): appends a note to a ticket, deduplicated by its
  ``idempotency_key`` argument — a resend under the same key answers with the
  note already made and changes nothing (class ``provider_key``).

The MCP endpoint is ``POST /mcp``. Beside it, like the provider sandbox:

* ``GET|DELETE /_sandbox/requests`` — every JSON-RPC request received (method,
  tool, arguments, key, HTTP status, fault); DELETE also forgets the tickets;
* ``GET /_sandbox/effects`` — every side effect, each with its key (if any);
* ``GET|POST|DELETE /_sandbox/faults`` — arm a fault on a tool, in the provider
  sandbox's style (sandbox/faults.py)::

      {"tool": "create_ticket", "mode": "drop_response", "count": 1, "delay_ms": 0}

  ``drop_response`` performs the call's effect, then closes the connection
  without a result; ``error`` answers 503 before any effect; ``delay`` is slow;
  ``key_prefix`` narrows a fault to calls whose key starts so;
* ``GET /healthz``.

With a ``token``, every ``/mcp`` request needs ``Authorization: Bearer <token>``
(401 otherwise, logged without the header's value).
"""

from __future__ import annotations

import asyncio
import hmac
import json
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import ToolAnnotations
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandbox.faults import DroppedResponse, FaultSpecError, FaultTable
from sandbox.json_http import JSONResponse, read_json
from sandbox.request_log import RequestLog

MCP_PATH = "/mcp"
KEY_ARGUMENT = "idempotency_key"
TOOLS = ("list_tickets", "create_ticket", "add_note")


class TicketDesk:
    """The server's state: tickets, notes by key, and every effect made."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.tickets: dict[str, dict[str, Any]] = {}
        self.notes_by_key: dict[str, dict[str, Any]] = {}
        self.effects: list[dict[str, Any]] = []

    def list_tickets(self, status: str | None = None) -> dict[str, Any]:
        found = [t for t in self.tickets.values() if status in (None, t["status"])]
        return {"tickets": found}

    def create_ticket(self, title: str, body: str = "") -> dict[str, Any]:
        ticket: dict[str, Any] = {"id": f"T-{len(self.tickets) + 1}", "title": title}
        ticket |= {"body": body, "status": "open", "notes": []}
        self.tickets[ticket["id"]] = ticket
        self.effects.append({"tool": "create_ticket", "key": None, "ticket_id": ticket["id"]})
        return {"ticket": ticket}

    def add_note(self, ticket_id: str, text: str, idempotency_key: str) -> dict[str, Any]:
        if not idempotency_key:
            raise ToolError("idempotency_key must not be empty")
        known = self.notes_by_key.get(idempotency_key)
        if known is not None:  # a resend: the note made the first time, nothing new
            return {"note": known, "replayed": True}
        ticket = self.tickets.get(ticket_id)
        if ticket is None:
            raise ToolError(f"no ticket {ticket_id!r}")
        note = {"ticket_id": ticket_id, "text": text, "key": idempotency_key}
        ticket["notes"].append(note)
        self.notes_by_key[idempotency_key] = note
        self.effects.append({"tool": "add_note", "key": idempotency_key, "ticket_id": ticket_id})
        return {"note": note, "replayed": False}


def build_mcp(desk: TicketDesk) -> MCPServer:
    server = MCPServer("agentrun-sandbox-tickets", log_level="WARNING")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def list_tickets(status: str | None = None) -> dict[str, Any]:
        """List the desk's tickets, optionally only those with this status."""
        return desk.list_tickets(status)

    @server.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=False))
    def create_ticket(title: str, body: str = "") -> dict[str, Any]:
        """Open a new ticket (every call opens another)."""
        return desk.create_ticket(title, body)

    @server.tool(annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=True))
    def add_note(ticket_id: str, text: str, idempotency_key: str) -> dict[str, Any]:
        """Add a note to a ticket; a call repeated with the same idempotency_key adds nothing."""
        return desk.add_note(ticket_id, text, idempotency_key)

    return server


class McpSandbox:
    """The ASGI app: bearer check, request log and faults around the SDK's MCP app."""

    def __init__(self, token: str | None = None) -> None:
        self.desk = TicketDesk()
        self.log = RequestLog()
        self.faults = FaultTable(list(TOOLS))
        self._token = token
        # Reachable so a test can add or drop a tool between two syncs.
        self.mcp = mcp = build_mcp(self.desk)
        # Stateless JSON answers: one POST, one JSON reply; a dropped reply is a lost result.
        self._mcp_app = mcp.streamable_http_app(
            streamable_http_path=MCP_PATH,
            stateless_http=True,
            json_response=True,
            # The sandbox is reached by whatever host name a test or compose file uses.
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self._manager = mcp.session_manager
        self._running: asyncio.Future[None] | None = None
        self._manager_task: asyncio.Task[None] | None = None  # held: the loop keeps weak refs
        self._outer = Starlette(routes=self._routes())

    @property
    def routes(self) -> list[BaseRoute]:
        """Every route but MCP's own (MCP_PATH): the sandbox's controls, for a test to walk."""
        return list(self._outer.routes)

    def _routes(self) -> list[Route]:
        return [
            Route("/_sandbox/requests", self.requests, methods=["GET", "DELETE"]),
            Route("/_sandbox/faults", self.faults_endpoint, methods=["GET", "POST", "DELETE"]),
            Route("/_sandbox/effects", self.effects, methods=["GET"]),
            Route("/healthz", _healthz, methods=["GET"]),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].rstrip("/") != MCP_PATH:
            await self._outer(scope, receive, send)
            return
        await self._started()
        await self._serve_mcp(scope, receive, send)

    async def _started(self) -> None:
        """The SDK's session manager runs for the server's life; `sandbox.serve` runs
        apps without lifespan events, so it starts with the first MCP request."""
        if self._running is None:
            ready = asyncio.get_running_loop().create_future()
            self._running = ready
            self._manager_task = asyncio.get_running_loop().create_task(self._run_manager(ready))
        await asyncio.shield(self._running)

    async def _run_manager(self, ready: asyncio.Future[None]) -> None:
        async with self._manager.run():
            ready.set_result(None)
            await asyncio.Event().wait()  # until the loop shuts down

    async def _serve_mcp(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await _read_body(receive)
        call = _rpc_call(body)
        entry: dict[str, Any] = {"method": scope["method"], **call}
        if not self._authorized(scope):
            entry.update(status=401, fault=None, authorized=False)
            self.log.record(**entry)
            await _unauthorized(scope, receive, send)
            return
        fault = self.faults.take(call["tool"], "", call["key"]) if call.get("tool") else None
        mode = fault.mode if fault else None
        entry["fault"] = mode
        if fault and mode in ("error", "rate_limit"):
            entry["status"] = fault.status
            self.log.record(**entry)
            await JSONResponse({"error": f"sandbox fault: {mode}"}, fault.status)(
                scope, receive, send
            )
            return
        if fault and mode == "delay":
            await asyncio.sleep(fault.delay_seconds)
        replay = _replay(body)
        if fault and mode == "drop_response":
            status = await _swallowed(self._mcp_app, scope, replay)
            entry["status"] = status  # recorded before the hang, like the provider sandbox
            self.log.record(**entry)
            await asyncio.sleep(fault.delay_seconds)
            await DroppedResponse()(scope, receive, send)
            return
        await self._mcp_app(scope, replay, _status_recorder(send, entry, self.log))

    def _authorized(self, scope: Scope) -> bool:
        if self._token is None:
            return True
        headers = dict(scope["headers"])
        given = headers.get(b"authorization", b"")
        return hmac.compare_digest(given, f"Bearer {self._token}".encode())

    async def requests(self, request: Request) -> Response:
        if request.method == "DELETE":
            self.log.clear()
            self.desk.reset()
        return JSONResponse({"requests": self.log.entries()})

    async def effects(self, request: Request) -> Response:
        wanted = request.query_params.get("tool")
        found = [e for e in self.desk.effects if wanted in (None, e["tool"])]
        return JSONResponse({"effects": found})

    async def faults_endpoint(self, request: Request) -> Response:
        if request.method == "POST":
            try:
                self.faults.arm(_as_provider_spec(await read_json(request)))
            except FaultSpecError as exc:
                return JSONResponse({"error": str(exc).replace("provider", "tool")}, 400)
        elif request.method == "DELETE":
            self.faults.clear()
        return JSONResponse({"faults": self.faults.to_json()})


def create_app(token: str | None = None) -> McpSandbox:
    """The MCP sandbox app; its state is reachable as `.desk`, `.log`, `.faults`, `.mcp`."""
    return McpSandbox(token=token)


def _rpc_call(body: bytes) -> dict[str, Any]:
    """What the log keeps of one JSON-RPC request: method, and for tools/call the
    tool, its arguments and its key argument."""
    try:
        message = json.loads(body) if body else None
    except (ValueError, RecursionError):
        message = None
    if not isinstance(message, dict):
        return {"rpc": None, "tool": None, "arguments": None, "key": None}
    if message.get("method") != "tools/call":
        return {"rpc": message.get("method"), "tool": None, "arguments": None, "key": None}
    params = _object(message.get("params"))
    arguments = _object(params.get("arguments"))
    key, name = arguments.get(KEY_ARGUMENT), params.get("name")
    return {
        "rpc": "tools/call",
        "tool": name if isinstance(name, str) else None,
        "arguments": arguments,
        "key": key if isinstance(key, str) else None,
    }


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _as_provider_spec(spec: Any) -> Any:
    """A fault aimed at a tool, in the shape sandbox.faults.FaultTable arms."""
    if not isinstance(spec, dict):
        return spec
    rest = {k: v for k, v in spec.items() if k not in ("tool", "provider", "path")}
    return {"provider": spec.get("tool"), **rest}


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes) -> Receive:
    """A receive channel that yields the already-read body once, then waits."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # like a client that keeps the connection open
        return {"type": "http.disconnect"}

    return receive


async def _swallowed(app: ASGIApp, scope: Scope, receive: Receive) -> int:
    """Run the app to the end (the effect happens) and keep its reply; its status."""
    status = 0

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


def _status_recorder(send: Send, entry: dict[str, Any], log: RequestLog) -> Send:
    async def recording(message: Message) -> None:
        if message["type"] == "http.response.start":
            log.record(**entry, status=message["status"])
        await send(message)

    return recording


async def _unauthorized(scope: Scope, receive: Receive, send: Send) -> None:
    response = JSONResponse({"error": "missing or wrong bearer token"}, 401)
    response.headers["WWW-Authenticate"] = 'Bearer realm="sandbox-mcp"'
    await response(scope, receive, send)


async def _healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})
