"""The HTTP/JSON API's OpenAPI 3.1 document, written from the route table (api.OPS) and the
proto descriptors, served at GET /v1/openapi.json and checked in as docs/openapi.json.

`make gen` (or `python -m control_plane.http.openapi > docs/openapi.json`) writes the file
again after a route or a message changes; tests/integration/test_http_api.py fails while it
differs.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agentrun.v1 import run_pb2
from control_plane.http import jsonmap
from control_plane.http.api import IDEMPOTENCY_KEY, LAST_EVENT_ID, OPS, SLUG, Op
from control_plane.http.problems import MEDIA_TYPE, TITLES, problem

PATH = "/v1/openapi.json"
_REF = "#/components/schemas/"
DESCRIPTION = (
    "agentrun's HTTP/JSON API: the gRPC methods a client calls (docs/api.md). Bodies and "
    "answers are the gRPC messages in proto3's JSON mapping with snake_case field names, "
    'enums as lower-case short names ("completed"), 64-bit integers as JSON numbers, '
    "and every `X_json` string field as `X` holding the JSON value itself. Errors are "
    "RFC 9457 problem details naming the field at fault. Authenticate with "
    "`Authorization: Bearer <API key or ID token>`; the roles are gRPC's."
)
# Identifiers the servicers check: the schema says what they accept.
_UUID_FIELDS = frozenset({"run_id", "approval_id", "session_id"})
_ERRORS_READ = ("400", "401", "403", "404", "503")
_ERRORS_WRITE = ("400", "401", "403", "404", "409", "429", "503")

PROBLEM = {
    "type": "object",
    "description": "RFC 9457 problem details.",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "code": {"type": "string", "description": "The gRPC status code's name."},
        "field": {
            "type": "string",
            "description": "The request field at fault (400), as this API names it.",
        },
    },
}
# The sessions' messages route (control_plane/http/sessions.py) predates the API: its
# errors are `{"error", "code"}`.
LEGACY_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string"}, "code": {"type": "string"}},
}


class _Components:
    def __init__(self) -> None:
        self.schemas: dict[str, Any] = {"Problem": PROBLEM, "LegacyError": LEGACY_ERROR}

    def ref(self, desc: jsonmap.Desc) -> dict[str, Any]:
        name = jsonmap.component_name(desc)
        if name not in self.schemas:
            self.schemas[name] = {}  # placeholder: a message may contain itself
            self.schemas[name] = jsonmap.response_schema(desc, self.ref)
        return {"$ref": _REF + name}


def _param_schema(op: Op, name: str) -> dict[str, Any]:
    field = op.request.DESCRIPTOR.fields_by_name[name]
    if name in _UUID_FIELDS:
        return {"type": "string", "format": "uuid"}
    if name == "agent_id":
        return dict(SLUG)
    # workspace_id: any text; the credential's workspace, else 403 (a typo is no 400).
    return jsonmap.field_schema(field, lambda d: {}, request=True, ranges=op.ranges)


def _parameters(op: Op) -> list[dict[str, Any]]:
    params = [
        {"name": n, "in": "path", "required": True, "schema": _param_schema(op, n)}
        for n in op.path_fields
    ]
    if op.stream:
        params += [
            {
                "name": "after_seq",
                "in": "query",
                "description": "Send the steps after this seq (default: all of them).",
                "schema": {"type": "integer", "minimum": 0, "maximum": 2**31 - 2},
            },
            {
                "name": "deltas",
                "in": "query",
                "description": "Also send the model's output as it is generated (fast path).",
                "schema": {"type": "boolean"},
            },
            {
                "name": LAST_EVENT_ID,
                "in": "header",
                "description": "A reconnecting EventSource's last event id: resume after it.",
                "schema": {"type": "string", "pattern": "^[0-9]{1,10}$"},
            },
        ]
    elif op.method == "GET":
        for f in op.request.DESCRIPTOR.fields:
            if f.name in op.skip or f.GetOptions().deprecated:
                continue
            schema = jsonmap.field_schema(f, lambda d: {}, request=True, ranges=op.ranges)
            params.append({"name": jsonmap.json_name(f), "in": "query", "schema": schema})
    if op.rpc == "RunService/StartRun":
        params.append(
            {
                "name": IDEMPOTENCY_KEY,
                "in": "header",
                "description": "The request_id: a retried start returns the same run (200).",
                "schema": {"type": "string", "minLength": 1, "maxLength": 200},
            }
        )
    return params


def _body(op: Op) -> dict[str, Any]:
    schema = jsonmap.request_schema(
        op.request.DESCRIPTOR, skip=op.skip, required=op.required, ranges=op.ranges
    )
    for name, keywords in op.extra.items():
        schema["properties"][name].update(keywords)
    for name in op.any_json:
        schema["properties"][name] = {
            "description": "A string as it is; any other JSON value as its JSON text."
        }
    return {"required": bool(op.required), "content": {"application/json": {"schema": schema}}}


def _errors(codes: tuple[str, ...], media: str = MEDIA_TYPE, schema: str = "Problem") -> Any:
    return {
        code: {
            "description": TITLES[int(code)],
            "content": {media: {"schema": {"$ref": _REF + schema}}},
        }
        for code in codes
    }


def _operation(op: Op, components: _Components) -> dict[str, Any]:
    out: dict[str, Any] = {
        "operationId": op.operation_id,
        "summary": op.summary,
        "tags": [op.rpc.split("/")[0].removesuffix("Service")],
        "description": f"gRPC `agentrun.v1.{op.rpc.replace('/', '.')}`; needs `{op.need.value}`.",
    }
    params = _parameters(op)
    if params:
        out["parameters"] = params
    if op.method == "POST":
        out["requestBody"] = _body(op)
    if op.stream:
        ok: dict[str, Any] = {
            "200": {
                "description": "Server-sent events: `run` (the run, first and whenever its "
                "state changes), `step` (id: its seq), `delta`, then `end`; `error` if the "
                "stream fails after it started.",
                "content": {"text/event-stream": {"schema": _events(components)}},
            }
        }
    else:
        answered: jsonmap.Desc = op.response.DESCRIPTOR
        if op.unwrap:
            answered = answered.fields_by_name[op.unwrap].message_type
        content = {"application/json": {"schema": components.ref(answered)}}
        codes = ("201", "200") if op.created else (str(op.status),)
        ok = {
            code: {"description": "Created" if code == "201" else "OK", "content": content}
            for code in codes
        }
    errors = _ERRORS_WRITE if op.method == "POST" else _ERRORS_READ
    out["responses"] = {**ok, **_errors(errors)}
    return out


def _events(components: _Components) -> dict[str, Any]:
    """WatchRun's events (each one; OpenAPI 3.1 has `schema` describe an event); a comment
    line (`: keep-alive`) is no event."""

    def event(name: str, data: dict[str, Any], with_id: bool = False) -> dict[str, Any]:
        props = {
            "event": {"const": name},
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": data,
            },
        }
        if with_id:
            props["id"] = {"type": "string", "pattern": "^[0-9]+$"}
        return {"type": "object", "required": ["event", "data"], "properties": props}

    return {
        "oneOf": [
            event("run", components.ref(run_pb2.Run.DESCRIPTOR)),
            event("step", components.ref(run_pb2.Step.DESCRIPTOR), with_id=True),
            event("delta", components.ref(run_pb2.RunDelta.DESCRIPTOR)),
            event("end", {"type": "object"}),
            event("error", {"$ref": _REF + "Problem"}),
        ]
    }


def _messages_operation(op: Op) -> dict[str, Any]:
    """POST sessions/{session_id}/messages, as control_plane/http/sessions.py serves it."""
    body = {
        "type": "object",
        "required": ["text"],
        "properties": {
            "text": {"type": "string", "minLength": 1},
            "request_id": {"type": "string"},
            "strategy": {
                "type": "string",
                "enum": ["", "reject", "enqueue", "interrupt", "rollback"],
            },
            "priority": {"type": ["integer", "null"], "minimum": -100, "maximum": 100},
        },
    }
    turn = {
        "type": "object",
        "required": ["turn", "run_id", "status", "priority", "created"],
        "properties": {
            "turn": {"type": "integer"},
            "run_id": {"type": "string", "format": "uuid"},
            "status": {"type": "string"},
            "priority": {"type": "integer"},
            "created": {"type": "boolean"},
        },
    }
    return {
        "operationId": op.operation_id,
        "summary": op.summary.split(" (")[0],
        "tags": ["Session"],
        "description": "The session's next turn, or 409 while the previous one is in progress "
        '(errors here are `{"error", "code"}`); needs `operate`.',
        "parameters": [
            {"name": n, "in": "path", "required": True, "schema": _param_schema(op, n)}
            for n in op.path_fields
        ],
        "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
        "responses": {
            "202": {"description": "Accepted", "content": {"application/json": {"schema": turn}}},
            **_errors(_ERRORS_WRITE, "application/json", "LegacyError"),
        },
    }


def _self_operation() -> dict[str, Any]:
    return {
        "operationId": "GetOpenApiDocument",
        "summary": "This document",
        "tags": ["Meta"],
        "security": [],
        "responses": {
            "200": {
                "description": "OK",
                "content": {"application/json": {"schema": {"type": "object"}}},
            }
        },
    }


STREAMS_PATH = "/v1/workspaces/{workspace_id}/streams/{path}"


_STREAM_PARAMS = [
    {"name": "workspace_id", "in": "path", "required": True, "schema": {"type": "string"}},
    {
        "name": "path",
        "in": "path",
        "required": True,
        "description": "The stream's path under the workspace (it may contain `/`).",
        "schema": {"type": "string"},
    },
]
_STREAM_READ_PARAMS = [
    {"name": "offset", "in": "query", "schema": {"type": "string"}},
    {"name": "live", "in": "query", "schema": {"type": "string", "enum": ["long-poll", "sse"]}},
    {"name": "cursor", "in": "query", "schema": {"type": "string"}},
]
_ANY_BODY = {"*/*": {"schema": {"type": "string", "format": "binary"}}}


def _stream_op(
    name: str, summary: str, need: str, ok: dict[str, Any], errors: tuple[str, ...], **more: Any
) -> dict[str, Any]:
    """One operation of the Durable Streams protocol: its own headers, bodies and text
    errors, not this API's JSON (control_plane/http/streams.py, docs/streams.md)."""
    text = {"text/plain": {"schema": {"type": "string"}}}
    failed = {c: {"description": TITLES.get(int(c), "Error"), "content": text} for c in errors}
    return {
        "operationId": name,
        "summary": summary,
        "tags": ["Streams"],
        "description": f"The Durable Streams protocol; needs `{need}`.",
        "parameters": _STREAM_PARAMS,
        "responses": {**ok, **failed},
        **more,
    }


def _streams_operations() -> dict[str, Any]:
    read_ok = {
        "200": {"description": "Messages", "content": _ANY_BODY},
        "204": {"description": "Nothing new before the long-poll ended"},
        "304": {"description": "Not modified"},
    }
    gone = ("401", "403", "404", "410")
    body = {"requestBody": {"required": False, "content": _ANY_BODY}}
    created = {"200": {"description": "Already there"}, "201": {"description": "Created"}}
    appended = {"200": {"description": "Appended"}, "204": {"description": "Appended or closed"}}
    return {
        "get": _stream_op(
            "ReadStream",
            "Read a stream from an offset (catch-up, long-poll or SSE)",
            "read",
            read_ok,
            ("400", *gone),
            parameters=_STREAM_PARAMS + _STREAM_READ_PARAMS,
        ),
        "head": _stream_op(
            "GetStreamMetadata",
            "A stream's tail offset, type, closing and expiry",
            "read",
            {"200": {"description": "OK"}},
            gone,
        ),
        "put": _stream_op(
            "CreateStream",
            "Create a stream (or find the same one)",
            "operate",
            created,
            ("400", "401", "403", "404", "409"),
            **body,
        ),
        "post": _stream_op(
            "AppendToStream",
            "Append to a stream (idempotent producers), or close it",
            "operate",
            appended,
            ("400", "401", "403", "404", "409", "410", "413"),
            **body,
        ),
        "delete": _stream_op(
            "DeleteStream", "Delete a stream", "operate", {"204": {"description": "Deleted"}}, gone
        ),
    }


@functools.cache
def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of every route in api.OPS (and of itself)."""
    components = _Components()
    paths: dict[str, dict[str, Any]] = {PATH: {"get": _self_operation()}}
    for op in OPS:
        operation = _messages_operation(op) if op.elsewhere else _operation(op, components)
        paths.setdefault(op.full_path, {})[op.method.lower()] = operation
    paths[STREAMS_PATH] = _streams_operations()
    return {
        "openapi": "3.1.0",
        "info": {"title": "agentrun HTTP API", "version": "v1", "description": DESCRIPTION},
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An agentrun API key, or an OpenID Connect ID token.",
                }
            },
            "schemas": dict(sorted(components.schemas.items())),
        },
    }


def rendered() -> str:
    """The document as docs/openapi.json holds it."""
    return json.dumps(document(), indent=2) + "\n"


async def serve(request: Request) -> Response:
    return JSONResponse(document())


def routes() -> list[Route]:
    return [Route(PATH, serve, methods=["GET"])]


@functools.cache
def _templates() -> list[tuple[re.Pattern[str], str]]:
    """Each documented path as a pattern, with the methods it is documented for."""
    out = []
    for path, operations in document()["paths"].items():
        pattern = re.escape(path).replace(r"\{", "{").replace(r"\}", "}")
        pattern = re.sub(r"{[a-z_]+}", "[^/]+", pattern)
        out.append((re.compile(f"^{pattern}$"), ", ".join(m.upper() for m in operations)))
    return out


async def not_served(request: Request) -> Response:
    """Under /v1/, what no route serves: 405 naming the methods of a documented path, else
    404, both as problem details (never a bare text answer)."""
    for pattern, allow in _templates():
        if pattern.match(request.url.path):
            detail = f"{request.method} is not served here"
            return problem(405, detail, headers={"Allow": allow})
    return problem(404, f"no route {request.url.path}")


def fallback() -> Route:
    """The last route of the app (after every module's)."""
    return Route("/v1/{rest:path}", not_served, methods=list(_ALL_METHODS))


_ALL_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE")


if __name__ == "__main__":
    print(rendered(), end="")
