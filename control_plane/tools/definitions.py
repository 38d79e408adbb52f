"""A tool definition is checked when it is saved: `validate` raises InvalidArgument naming
the field (`tool.http.url`, `tool.idempotency`, ...), so nothing malformed reaches the
registry, a publish, or an executor.

What it holds to (tool.proto says what each field means):

* a name the model can call (letters, digits, '_' and '-', 1-64), a JSON Schema (2020-12)
  object of the arguments;
* reads have no idempotency class; a write has one (provider_key, lookup or none), and
  `lookup` comes with how to ask;
* an HTTP template has a method, an absolute http(s) URL whose `{placeholders}` (and those of
  headers, query and body) are arguments of the schema, no credential header of its own (the
  token comes from `connection` at call time, sent as `auth` says), bounded size and timeout;
* an MCP target names its server, tool and streamable HTTP URL, and a bounded timeout;
* no URL's host is a literal address tools may not reach (ground/netguard.py:
  link-local, multicast, unspecified; private and loopback when the operator denies them).
  Names are checked again, resolved, at every call.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

import jsonpointer
from jsonschema import Draft202012Validator, SchemaError

from agentrun.v1 import tool_pb2
from control_plane.ground.errors import InvalidArgument
from control_plane.ground.validate import json_value
from ground import netguard

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
CONNECTION = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
TRIGGER = "trigger"
HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}$")
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
BUCKET = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")
CAPABILITIES = ("reads_private", "reads_untrusted", "communicates_externally", "moves_money")
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
BODIES = ("", "arguments")
# Credentials come from the connection, never from the definition.
CREDENTIAL_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "cookie",
        "x-api-key",
        "api-key",
        "x-auth-token",
    }
)
MAX_DEFINITION_BYTES = 64 * 1024
MAX_DESCRIPTION_BYTES = 4 * 1024
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
MAX_TIMEOUT_SECONDS = 300.0
MAX_RETENTION_HOURS = 24.0 * 366
MAX_SETTLE_SECONDS = 60.0
MAX_ENTRIES = 50  # headers, query parameters, scopes, capabilities


def validate(tool: tool_pb2.Tool) -> None:
    """Refuse (InvalidArgument naming the field) a definition that must not be saved."""
    if tool.ByteSize() > MAX_DEFINITION_BYTES:
        raise InvalidArgument(
            "tool", f"is {tool.ByteSize()} bytes; the limit is {MAX_DEFINITION_BYTES}"
        )
    if not NAME.match(tool.name):
        raise InvalidArgument("tool.name", "must be 1-64 letters, digits, '_' or '-'")
    if len(tool.description.encode()) > MAX_DESCRIPTION_BYTES:
        raise InvalidArgument("tool.description", f"is over {MAX_DESCRIPTION_BYTES} bytes")
    arguments = parameters(tool.parameters_json)
    _check_class(tool)
    _check_marks(tool)
    transport = tool.WhichOneof("transport")
    if transport == "http":
        _check_http(tool, arguments)
    elif transport == "mcp":
        _check_mcp(tool.mcp)
    else:
        raise InvalidArgument("tool.http", "is required (or tool.mcp): how the tool is called")


def parameters(raw: str) -> frozenset[str]:
    """The argument names of a valid JSON Schema object (InvalidArgument otherwise)."""
    field = "tool.parameters_json"
    if not raw:
        raise InvalidArgument(field, "is required: the JSON Schema of the arguments")
    schema = json_value(field, raw)
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise InvalidArgument(field, 'must be a JSON Schema of "type": "object"')
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise InvalidArgument(field, f"is not a valid JSON Schema: {exc.message}") from None
    properties = schema.get("properties") or {}
    return frozenset(properties) if isinstance(properties, dict) else frozenset()


def _check_class(tool: tool_pb2.Tool) -> None:
    """Reads have no class; a write has one, and lookup how to ask."""
    if tool.access not in (tool_pb2.TOOL_ACCESS_READ, tool_pb2.TOOL_ACCESS_WRITE):
        raise InvalidArgument("tool.access", "must be READ or WRITE")
    unset = tool.idempotency == tool_pb2.IDEMPOTENCY_CLASS_UNSPECIFIED
    if tool.access == tool_pb2.TOOL_ACCESS_WRITE and unset:
        raise InvalidArgument(
            "tool.idempotency", "is required for a write: PROVIDER_KEY, LOOKUP or NONE"
        )
    if tool.access == tool_pb2.TOOL_ACCESS_READ and not unset:
        raise InvalidArgument("tool.idempotency", "is for writes only")
    is_lookup = tool.idempotency == tool_pb2.IDEMPOTENCY_CLASS_LOOKUP
    if is_lookup != tool.HasField("lookup"):
        raise InvalidArgument("tool.lookup", "is required with class LOOKUP, and only then")
    if is_lookup:
        _check_lookup(tool.lookup)
    keyed = tool.idempotency == tool_pb2.IDEMPOTENCY_CLASS_PROVIDER_KEY
    if tool.idempotency_header and not (keyed and HEADER_NAME.match(tool.idempotency_header)):
        raise InvalidArgument(
            "tool.idempotency_header", "must be a header name, with class PROVIDER_KEY only"
        )
    if tool.idempotency_header.lower() in CREDENTIAL_HEADERS:
        raise InvalidArgument("tool.idempotency_header", "may not be a credential header")
    if not 0 <= tool.key_retention_hours <= MAX_RETENTION_HOURS:
        raise InvalidArgument(
            "tool.key_retention_hours", f"must be between 0 and {MAX_RETENTION_HOURS:g}"
        )


def _check_lookup(lookup: tool_pb2.ToolLookup) -> None:
    for name in ("stamp_body_field", "stamp_name", "matches"):
        if not getattr(lookup, name):
            raise InvalidArgument(f"tool.lookup.{name}", "is required")
    _absolute_url("tool.lookup.url", lookup.url)
    if "{key}" not in "".join(lookup.query.values()):
        raise InvalidArgument("tool.lookup.query", "must carry {key} in a value")
    if not 0 <= lookup.settle_seconds <= MAX_SETTLE_SECONDS:
        raise InvalidArgument(
            "tool.lookup.settle_seconds", f"must be between 0 and {MAX_SETTLE_SECONDS:g}"
        )


def _check_marks(tool: tool_pb2.Tool) -> None:
    if tool.connection and tool.connection != TRIGGER and not CONNECTION.match(tool.connection):
        raise InvalidArgument("tool.connection", 'must be a provider name (lowercase) or "trigger"')
    if tool.rate_bucket and not BUCKET.match(tool.rate_bucket):
        raise InvalidArgument("tool.rate_bucket", "must be 1-100 letters, digits, '_.:-'")
    _bounded("tool.scopes", tool.scopes)
    _bounded("tool.capabilities", tool.capabilities)
    for i, mark in enumerate(tool.capabilities):
        if mark not in CAPABILITIES:
            raise InvalidArgument(f"tool.capabilities[{i}]", f"must be one of {CAPABILITIES}")
    for i, scope in enumerate(tool.scopes):
        if not BUCKET.match(scope):
            raise InvalidArgument(f"tool.scopes[{i}]", "is not a scope name")


def _check_http(tool: tool_pb2.Tool, arguments: frozenset[str]) -> None:
    http = tool.http
    if http.method not in METHODS:
        raise InvalidArgument("tool.http.method", f"must be one of {', '.join(METHODS)}")
    _absolute_url("tool.http.url", http.url)
    _placeholders("tool.http.url", http.url, arguments)
    _bounded("tool.http.headers", http.headers)
    _bounded("tool.http.query", http.query)
    for name, value in http.headers.items():
        field = f"tool.http.headers[{name}]"
        if not HEADER_NAME.match(name):
            raise InvalidArgument(field, "is not a header name")
        if name.lower() in CREDENTIAL_HEADERS:
            raise InvalidArgument(
                field, "carries credentials: name a connection and set tool.http.auth instead"
            )
        if not value.isascii() or not value.isprintable():
            raise InvalidArgument(field, "must be printable ASCII")
        _placeholders(field, value, arguments)
    for name, value in http.query.items():
        _placeholders(f"tool.http.query[{name}]", value, arguments)
    _check_body(http.body, arguments)
    _check_pointer(http.response_pointer)
    if not 0 <= http.max_response_bytes <= MAX_RESPONSE_BYTES:
        raise InvalidArgument(
            "tool.http.max_response_bytes", f"must be between 0 and {MAX_RESPONSE_BYTES}"
        )
    if not 0 <= http.timeout_seconds <= MAX_TIMEOUT_SECONDS:
        raise InvalidArgument(
            "tool.http.timeout_seconds", f"must be between 0 and {MAX_TIMEOUT_SECONDS:g}"
        )
    _check_auth(tool)


def _check_pointer(pointer: str) -> None:
    """A response_pointer parses as RFC 6901 ('/a/0', '~0' and '~1' the only escapes). Whether
    an answer has something there is known only when one comes: a call whose answer has
    nothing there fails naming the pointer (executor/tools/template.py)."""
    if not pointer:
        return
    try:
        jsonpointer.JsonPointer(pointer)
    except jsonpointer.JsonPointerException as exc:
        raise InvalidArgument(
            "tool.http.response_pointer", f"must be a JSON Pointer ('/a/0'): {exc}"
        ) from None


def _check_auth(tool: tool_pb2.Tool) -> None:
    auth = tool.http.auth
    if not auth:
        if tool.connection:
            raise InvalidArgument(
                "tool.http.auth", 'is required with a connection: "bearer" or "header:<Name>"'
            )
        return
    if not tool.connection:
        raise InvalidArgument(
            "tool.connection", "is required with tool.http.auth: it supplies the token"
        )
    if auth == "bearer":
        return
    kind, _, name = auth.partition(":")
    if kind != "header" or not HEADER_NAME.match(name):
        raise InvalidArgument("tool.http.auth", 'must be "bearer" or "header:<Name>"')
    if name.lower() in {h.lower() for h in tool.http.headers}:
        raise InvalidArgument("tool.http.auth", f"header {name} is also set in tool.http.headers")


def _check_body(body: str, arguments: frozenset[str]) -> None:
    if body in BODIES:
        return
    if not body.lstrip().startswith("{"):
        raise InvalidArgument("tool.http.body", '"", "arguments", or a JSON object template')
    template = json_value("tool.http.body", body)
    if not isinstance(template, dict):
        raise InvalidArgument("tool.http.body", "a template must be a JSON object")
    for leaf in _string_leaves(template):
        _placeholders("tool.http.body", leaf, arguments)


def _string_leaves(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _string_leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from _string_leaves(item)


def _check_mcp(mcp: tool_pb2.McpTarget) -> None:
    if not CONNECTION.match(mcp.server_id):
        raise InvalidArgument("tool.mcp.server_id", "must be a server id (lowercase)")
    if not mcp.tool or len(mcp.tool) > 128:
        raise InvalidArgument("tool.mcp.tool", "must be the server's tool name (1-128)")
    _absolute_url("tool.mcp.url", mcp.url)
    if not 0 <= mcp.timeout_seconds <= MAX_TIMEOUT_SECONDS:
        raise InvalidArgument(
            "tool.mcp.timeout_seconds", f"must be between 0 and {MAX_TIMEOUT_SECONDS:g}"
        )


def reachable(field: str, url: str) -> None:
    """Refuse a URL whose host is a literal address tools may not reach (a name is
    resolved and checked at call time)."""
    if (why := netguard.literal_refusal(urlsplit(PLACEHOLDER.sub("x", url)).hostname)) is not None:
        raise InvalidArgument(field, why)


def _absolute_url(field: str, url: str) -> None:
    if not url:
        raise InvalidArgument(field, "is required")
    parts = urlsplit(PLACEHOLDER.sub("x", url))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgument(field, "must be an absolute http(s) URL")
    if parts.username or parts.password:
        raise InvalidArgument(field, "may not carry credentials (name a connection instead)")
    if parts.fragment:
        raise InvalidArgument(field, "may not have a fragment")
    if PLACEHOLDER.search(urlsplit(url).netloc):
        raise InvalidArgument(field, "may use placeholders in its path and query only")
    reachable(field, url)


def _placeholders(field: str, template: str, arguments: frozenset[str]) -> None:
    for name in PLACEHOLDER.findall(template):
        if name not in arguments:
            raise InvalidArgument(field, f"{{{name}}} is not an argument of tool.parameters_json")


def _bounded(field: str, entries: Mapping[str, str] | Iterable[str]) -> None:
    if len(list(entries)) > MAX_ENTRIES:
        raise InvalidArgument(field, f"has more than {MAX_ENTRIES} entries")
