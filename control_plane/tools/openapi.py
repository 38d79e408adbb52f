"""Import from OpenAPI 3: each chosen operation of a document becomes an HTTP-template tool.

The document (JSON or YAML text, OpenAPI 3.0 or 3.1) is read as openapi-spec-validator
reads a file (jsonschema-path's YAML loader, then JSON's data model: an unquoted `200:`
response key is the string "200", as in JSON) and validated by it; a bad one is refused as
INVALID_ARGUMENT naming `document` with the first line of the validator's message. Only local
`$ref`s (`#/...`) are resolved, never files or URLs; a recursive schema is cut
where it recurses (that branch accepts any value).

Each operation becomes one `Tool`:

* **name**: the operationId, with every run of characters outside
  `[A-Za-z0-9_-]` turned into `_`, at most 64 characters. An operation without
  an operationId gets a derived one, `<method>_<path>` the same way
  (`GET /products/{sku}` -> `get_products_sku`); `operations` and `classes`
  take that derived name. Two operations that end up with one name are refused.
* **description**: the summary, then the description (or `METHOD path`).
* **parameters_json**: one JSON Schema object of the path, query and header
  parameters and the properties of the JSON request body (OpenAPI 3.0's
  `nullable` and boolean `exclusiveMinimum/Maximum` are translated, `example`
  and the like dropped). Parameters are named as the document names them, but
  with characters outside `[A-Za-z0-9_]` turned into `_` (`X-Trace-Id` ->
  `X_Trace_Id`; a leading digit gets a `_`) so they can stand in a `{name}`
  placeholder. Not exposed to
  the model: cookies (a template cannot send them), credential headers
  (`Authorization`, `X-API-Key`, ...: the token comes from the connection),
  `Content-Type`/`Accept`, and a
  documented idempotency-key header (the platform sends its own key).
  readOnly body properties are left out (the server assigns them).
* **collisions**: a body property named like a parameter is exposed as
  `body_<name>`, and the body becomes a JSON object template mapping each
  property to its argument (`{"sku": "{body_sku}"}`); without collisions the
  body is `"arguments"` (every argument the URL, headers and query did not use).
  A request body that is not JSON, or not an object, is refused: import the
  other operations.
* **access**: GET and HEAD are reads; POST, PUT, PATCH and DELETE writes
  (OPTIONS and TRACE operations are not imported). A write needs its class in
  `classes[<operation>]`: without one it is refused naming that field, and
  nothing is imported. A write that documents an `Idempotency-Key` header
  (any header whose name ends so) is *proposed* as provider_key with that
  header: a dry run returns the proposal, an import still needs the class
  stated. A class given for a read, or for an operation not imported, is
  refused too (a typo must not pass as a decision).
* **http**: the absolute URL of `base_url`, else the first server of the
  operation, its path or the document (variables at their defaults), plus
  the path; query and header parameters map to their arguments.
* **connection/auth**: as the request says; with a connection and no auth,
  the operation's security scheme decides (`apiKey` in a header ->
  `header:<Name>`, otherwise `bearer`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import jsonpointer
import yaml
from jsonschema_path.loaders import JsonschemaSafeLoader

from agentrun.v1 import tool_pb2
from control_plane.ground.errors import InvalidArgument
from control_plane.tools import definitions

MAX_DOCUMENT_CHARS = 2_000_000
# Schemas inlined from $refs can outgrow the text (YAML anchors, shared components).
MAX_RESOLVED_NODES = 200_000
MAX_DEPTH = 64
METHODS = ("get", "head", "post", "put", "patch", "delete")
READS = ("get", "head")
MAX_NAME = 64
MAX_DESCRIPTION = 1024
_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_-]+")
_NOT_IN_ARGUMENT = re.compile(r"[^A-Za-z0-9_]+")
_PLACEHOLDER = re.compile(r"\{([^{}]+)\}")
_HIDDEN_HEADERS = definitions.CREDENTIAL_HEADERS | {"content-type", "accept"}
_VERSIONS = ("3.0", "3.1")


@dataclass(frozen=True)
class ImportSpec:
    """What an ImportOpenApiRequest asks for, besides the document."""

    operations: Sequence[str] = ()
    classes: Mapping[str, tool_pb2.WriteClass] = field(default_factory=dict)
    base_url: str = ""
    connection: str = ""
    auth: str = ""
    dry_run: bool = False

    @classmethod
    def from_request(cls, request: tool_pb2.ImportOpenApiRequest) -> ImportSpec:
        return cls(
            operations=tuple(request.operations),
            classes=dict(request.classes),
            base_url=request.base_url.strip(),
            connection=request.connection.strip(),
            auth=request.auth.strip(),
            dry_run=request.dry_run,
        )


@dataclass(frozen=True)
class Operation:
    name: str  # operationId, or the derived one
    method: str
    path: str
    item: Mapping[str, Any]  # its path item
    spec: Mapping[str, Any]

    @property
    def is_read(self) -> bool:
        return self.method in READS


def import_tools(text: str, spec: ImportSpec) -> list[tool_pb2.Tool]:
    """The tools the chosen operations become (nothing saved); InvalidArgument names the field.

    Each is checked as a definition (definitions.validate, naming `tool.*`) here too, so a
    dry run refuses what an import would; a dry run's write with no class to propose is
    checked as if it had one, and returned without."""
    document = load_document(text)
    operations = chosen(list(iter_operations(document)), spec.operations)
    check_classes(operations, spec)
    tools = [to_tool(document, op, spec) for op in operations]
    seen: dict[str, str] = {}
    for op, tool in zip(operations, tools, strict=True):
        if tool.name in seen:
            raise InvalidArgument(
                "operations", f"{seen[tool.name]!r} and {op.name!r} both become tool {tool.name!r}"
            )
        seen[tool.name] = op.name
        _check_definition(tool)
    return tools


def _check_definition(tool: tool_pb2.Tool) -> None:
    if tool.access == tool_pb2.TOOL_ACCESS_WRITE and not tool.idempotency:
        classed = tool_pb2.Tool()
        classed.CopyFrom(tool)
        classed.idempotency = tool_pb2.IDEMPOTENCY_CLASS_NONE
        tool = classed
    definitions.validate(tool)


# -- the document ----------------------------------------------------------------------


def load_document(text: str) -> dict[str, Any]:
    """Parse and validate an OpenAPI 3.0/3.1 document; InvalidArgument('document') if it is not."""
    if not text.strip():
        raise InvalidArgument("document", "is empty")
    if len(text) > MAX_DOCUMENT_CHARS:
        raise InvalidArgument("document", f"is larger than {MAX_DOCUMENT_CHARS} characters")
    document = _as_json(_parse(text))
    version = document.get("openapi")
    if not isinstance(version, str) or version[:3] not in _VERSIONS:
        found = "Swagger 2.0" if "swagger" in document else repr(version)
        raise InvalidArgument("document", f"not an OpenAPI 3.0 or 3.1 document ({found})")
    # Imported on first use: it is a third of the control plane's start-up otherwise.
    from openapi_spec_validator import OpenAPIV30SpecValidator, OpenAPIV31SpecValidator, validate

    validator = OpenAPIV30SpecValidator if version[:3] == "3.0" else OpenAPIV31SpecValidator
    try:
        validate(document, cls=validator)
    except Exception as exc:  # the validator's own errors, and its reference resolver's
        raise InvalidArgument("document", _first_line(exc)) from None
    return document


def _parse(text: str) -> dict[str, Any]:
    try:
        document = _json_or_yaml(text)
    except RecursionError:
        raise InvalidArgument("document", f"is nested more than {MAX_DEPTH} levels deep") from None
    if not isinstance(document, dict):
        raise InvalidArgument("document", "must be a JSON or YAML object")
    return document


def _json_or_yaml(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        # openapi-spec-validator's own loader (its readers' file handler): safe, timestamps
        # left as strings, 1e3 a float as in JSON.
        return yaml.load(text, Loader=JsonschemaSafeLoader)
    except yaml.YAMLError as exc:
        raise InvalidArgument("document", f"neither JSON nor YAML: {_first_line(exc)}") from None


def _as_json(document: dict[str, Any]) -> dict[str, Any]:
    """The document in JSON's data model, as openapi-spec-validator's reader makes it (a
    round trip through JSON): mapping keys become strings (YAML's `200:` is an integer,
    and OpenAPI's response codes are strings). The node count and depth are checked first,
    on the tree as loaded, before YAML aliases are expanded by the copy."""
    _only_local_refs(document)
    try:
        copied = json.loads(json.dumps(document))
    except (TypeError, ValueError) as exc:  # keys JSON has no form for, !!binary values
        raise InvalidArgument("document", f"is not JSON data: {_first_line(exc)}") from None
    return copied


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    # The reference resolver appends the whole document ("... does not exist within {...}").
    return text.splitlines()[0].split(" within {", 1)[0][:500]


def _only_local_refs(node: Any) -> None:
    """Refuse `$ref`s to files or URLs (the validator would go and fetch them), and
    documents deeper or larger than any API needs (the resolver and validator recurse)."""
    stack, visited = [(node, 0)], 0
    while stack:
        item, depth = stack.pop()
        visited += 1
        if visited > MAX_RESOLVED_NODES:  # YAML aliases can make a short text a huge tree
            raise InvalidArgument("document", f"has more than {MAX_RESOLVED_NODES} nodes")
        if depth > MAX_DEPTH:
            raise InvalidArgument("document", f"is nested more than {MAX_DEPTH} levels deep")
        if isinstance(item, dict):
            ref = item.get("$ref")
            if isinstance(ref, str) and not ref.startswith("#"):
                raise InvalidArgument("document", f"$ref {ref!r}: only local references (#/...)")
            stack.extend((value, depth + 1) for value in item.values())
        elif isinstance(item, list):
            stack.extend((value, depth + 1) for value in item)


class _Resolver:
    """Inlines local $refs, cutting recursion, with a cap on the nodes produced."""

    def __init__(self, document: Mapping[str, Any]) -> None:
        self.document = document
        self.nodes = 0

    def resolve(self, node: Any, seen: tuple[str, ...] = ()) -> Any:
        self.nodes += 1
        if self.nodes > MAX_RESOLVED_NODES:
            raise InvalidArgument("document", "too large once its $refs are resolved")
        if isinstance(node, list):
            return [self.resolve(item, seen) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if not isinstance(ref, str):
            return {key: self.resolve(value, seen) for key, value in node.items()}
        if ref in seen:
            return {}  # a recursive schema: the inner occurrence accepts anything
        target = self.resolve(self._target(ref), (*seen, ref))
        siblings = {k: self.resolve(v, seen) for k, v in node.items() if k != "$ref"}
        return {**target, **siblings} if isinstance(target, dict) else target

    def _target(self, ref: str) -> Any:
        """The node a local `$ref` names: its fragment, percent-decoded, as an RFC 6901
        pointer (jsonpointer)."""
        try:
            node = jsonpointer.resolve_pointer(self.document, unquote(ref.removeprefix("#")))
            if not isinstance(node, jsonpointer.EndOfList):  # "-": past a list's end
                return node
        except jsonpointer.JsonPointerException:
            pass
        raise InvalidArgument("document", f"$ref {ref!r} points at nothing")


# -- operations ------------------------------------------------------------------------


def iter_operations(document: Mapping[str, Any]) -> Iterator[Operation]:
    resolver = _Resolver(document)
    for path, raw_item in (document.get("paths") or {}).items():
        item = resolver.resolve(raw_item)
        for method in METHODS:
            if isinstance(item.get(method), dict):
                op = item[method]
                name = op.get("operationId") or _derived_name(method, path)
                yield Operation(str(name), method, path, item, op)


def _derived_name(method: str, path: str) -> str:
    return _NOT_IN_ARGUMENT.sub("_", f"{method} {path}").strip("_")


def chosen(operations: list[Operation], wanted: Sequence[str]) -> list[Operation]:
    if not operations:
        raise InvalidArgument("document", "has no operations to import")
    if not wanted:
        return operations
    by_name = {op.name: op for op in operations}
    for i, name in enumerate(wanted):
        if name not in by_name:
            known = ", ".join(sorted(by_name))
            raise InvalidArgument(f"operations[{i}]", f"no operation {name!r} (there are: {known})")
    return [by_name[name] for name in dict.fromkeys(wanted)]


def check_classes(operations: Sequence[Operation], spec: ImportSpec) -> None:
    by_name = {op.name: op for op in operations}
    for name in spec.classes:
        op = by_name.get(name)
        if op is None:
            raise InvalidArgument(f"classes[{name}]", "not an operation being imported")
        if op.is_read:
            raise InvalidArgument(f"classes[{name}]", f"{op.method.upper()} is a read: no class")


# -- one tool --------------------------------------------------------------------------


@dataclass
class _Arguments:
    """The tool's argument schema as it is built, and where each argument goes."""

    properties: dict[str, Any] = field(default_factory=dict)
    required: list[str] = field(default_factory=list)
    renamed_path: dict[str, str] = field(default_factory=dict)  # path param -> argument
    query: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    key_header: str = ""  # a documented idempotency-key header
    free_form: bool = False

    def add(self, wanted: str, schema: Any, required: bool, exact: bool = False) -> str:
        """Add an argument named `wanted` (made placeholder-safe unless `exact`, and unique)."""
        name = wanted if exact else _placeholder_safe(wanted)
        base, n = name, 2
        while name in self.properties:
            name, n = f"{base}_{n}", n + 1
        self.properties[name] = schema
        if required:
            self.required.append(name)
        return name

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "object", "properties": self.properties}
        if self.required:
            out["required"] = self.required
        if not self.free_form:
            out["additionalProperties"] = False
        return out


def _placeholder_safe(name: str) -> str:
    """A name that can stand in a `{placeholder}` (definitions.PLACEHOLDER)."""
    safe = _NOT_IN_ARGUMENT.sub("_", name) or "arg"
    return f"_{safe}" if safe[0].isdigit() else safe


def to_tool(document: Mapping[str, Any], op: Operation, spec: ImportSpec) -> tool_pb2.Tool:
    args = _Arguments()
    for param in _parameters(op):
        _add_parameter(args, param)
    body = _add_body(args, op, op.spec.get("requestBody"))
    url = _base_url(document, op, spec) + _PLACEHOLDER.sub(
        lambda m: "{" + args.renamed_path.get(m.group(1), m.group(1)) + "}", op.path
    )
    http = tool_pb2.HttpTemplate(
        method=op.method.upper(),
        url=url,
        query=args.query,
        headers=args.headers,
        body=body,
        auth=spec.auth or (_auth(document, op) if spec.connection else ""),
    )
    tool = tool_pb2.Tool(
        name=_tool_name(op.name),
        description=_description(op),
        parameters_json=json.dumps(args.schema(), sort_keys=True),
        connection=spec.connection,
        http=http,
        source="openapi",
    )
    if op.is_read:
        tool.access = tool_pb2.TOOL_ACCESS_READ
    else:
        tool.access = tool_pb2.TOOL_ACCESS_WRITE
        _write_class(tool, op, spec, args.key_header)
    return tool


def _tool_name(name: str) -> str:
    sanitized = _NOT_IN_NAME.sub("_", name).strip("_")[:MAX_NAME]
    if not sanitized:
        raise InvalidArgument("document", f"operationId {name!r} leaves no usable tool name")
    return sanitized


def _description(op: Operation) -> str:
    parts = [str(op.spec.get(k) or "").strip() for k in ("summary", "description")]
    text = "\n\n".join(dict.fromkeys(p for p in parts if p)) or f"{op.method.upper()} {op.path}"
    return text if len(text) <= MAX_DESCRIPTION else text[: MAX_DESCRIPTION - 1] + "…"


def _parameters(op: Operation) -> list[dict[str, Any]]:
    """Path-item parameters overridden by the operation's (same name and location)."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for param in [*(op.item.get("parameters") or []), *(op.spec.get("parameters") or [])]:
        merged[(param.get("in", ""), param.get("name", ""))] = param
    return list(merged.values())


def _add_parameter(args: _Arguments, param: Mapping[str, Any]) -> None:
    where, name = param.get("in"), str(param.get("name", ""))
    if where == "header" and name.lower().endswith("idempotency-key"):
        args.key_header = name
        return
    if where == "cookie" or (where == "header" and name.lower() in _HIDDEN_HEADERS):
        return
    schema = param.get("schema")
    if schema is None:  # `content` instead of `schema`: the one media type's schema
        media: dict[str, Any] = next(iter((param.get("content") or {}).values()), {})
        schema = media.get("schema", {})
    schema = json_schema(schema)
    if param.get("description") and isinstance(schema, dict):
        schema = {**schema, "description": str(param["description"])}
    argument = args.add(name, schema, where == "path" or bool(param.get("required")))
    if where == "path":
        args.renamed_path[name] = argument
    elif where == "query":
        args.query[name] = "{" + argument + "}"
    elif where == "header":
        args.headers[name] = "{" + argument + "}"


def _add_body(args: _Arguments, op: Operation, body: Any) -> str:
    """Add the JSON body's properties; return the template's `body`."""
    if not isinstance(body, dict):
        return ""
    content = body.get("content") or {}
    media = next((m for m in content if _is_json(m)), None)
    if media is None:
        types = ", ".join(content) or "no content"
        raise InvalidArgument("operations", f"{op.name}: request body is {types}, not JSON")
    properties, required, free_form = _object_parts(json_schema(content[media].get("schema", {})))
    if properties is None:
        raise InvalidArgument("operations", f"{op.name}: the JSON request body is not an object")
    args.free_form = free_form
    writable = {
        n: s for n, s in properties.items() if not (isinstance(s, dict) and s.get("readOnly"))
    }
    needed = {n for n in writable if n in required and body.get("required")}
    if not set(writable) & set(args.properties):  # no collision: the body is the leftovers
        for name, schema in writable.items():
            args.add(name, schema, name in needed, exact=True)
        return "arguments"
    taken = set(args.properties)
    placed = {
        name: args.add(f"body_{name}" if name in taken else name, schema, name in needed)
        for name, schema in writable.items()
    }
    return json.dumps({name: "{" + argument + "}" for name, argument in placed.items()})


def _is_json(media_type: str) -> bool:
    kind = media_type.split(";")[0].strip().lower()
    return kind == "application/json" or kind.endswith("+json")


def _object_parts(schema: Any) -> tuple[dict[str, Any] | None, set[str], bool]:
    """An object schema's properties, required names and whether it takes others too
    (allOf parts merged); properties None when the schema is not an object."""
    if not isinstance(schema, dict):
        return ({}, set(), True) if schema is True else (None, set(), False)
    properties: dict[str, Any] = dict(schema.get("properties") or {})
    required = set(schema.get("required") or [])
    objectish = schema.get("type") in ("object", None) or "properties" in schema
    for part in schema.get("allOf") or []:
        more, needed, _ = _object_parts(part)
        if more is None:
            return None, set(), False
        properties.update(more)
        required |= needed
    if not objectish:
        return None, set(), False
    free_form = not properties and schema.get("additionalProperties", True) is not False
    return properties, required, free_form


# -- schemas ---------------------------------------------------------------------------

_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_ONE = (
    "items",
    "not",
    "additionalProperties",
    "contains",
    "if",
    "then",
    "else",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
)
_NOT_JSON_SCHEMA = ("nullable", "example", "discriminator", "xml", "externalDocs")


def json_schema(schema: Any) -> Any:
    """An OpenAPI schema object as JSON Schema 2020-12 (its $refs already resolved)."""
    if not isinstance(schema, dict):
        return schema
    out = {k: _subschemas(k, v) for k, v in schema.items() if k not in _NOT_JSON_SCHEMA}
    if schema.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    for bound, limit in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        # 3.0: a flag on minimum/maximum; 2020-12: the bound itself.
        if isinstance(out.get(bound), bool) and out.pop(bound) and limit in out:
            out[bound] = out.pop(limit)
    return out


def _subschemas(key: str, value: Any) -> Any:
    if key in _SCHEMA_MAPS and isinstance(value, dict):
        return {name: json_schema(sub) for name, sub in value.items()}
    if key in _SCHEMA_LISTS and isinstance(value, list):
        return [json_schema(sub) for sub in value]
    return json_schema(value) if key in _SCHEMA_ONE else value


# -- where it is sent, and how a write is resolved -------------------------------------


def _base_url(document: Mapping[str, Any], op: Operation, spec: ImportSpec) -> str:
    if spec.base_url:
        if not _absolute(spec.base_url):
            raise InvalidArgument("base_url", f"{spec.base_url!r} is not an absolute http(s) URL")
        definitions.reachable("base_url", spec.base_url)
        return spec.base_url.rstrip("/")
    servers = op.spec.get("servers") or op.item.get("servers") or document.get("servers") or []
    url = _server_url(servers[0]) if servers else "/"
    if not _absolute(url):
        raise InvalidArgument(
            "base_url", f"the document's server URL {url!r} is not absolute http(s): give base_url"
        )
    definitions.reachable("base_url", url)  # the document's servers[0]
    return url.rstrip("/")


def _server_url(server: Mapping[str, Any]) -> str:
    url = str(server.get("url", "/"))
    for name, variable in (server.get("variables") or {}).items():
        url = url.replace("{" + name + "}", str(variable.get("default", "")))
    return url


def _absolute(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.netloc) and "{" not in url


def _auth(document: Mapping[str, Any], op: Operation) -> str:
    """How the connection's token is sent, from the operation's security scheme."""
    requirements = op.spec.get("security", document.get("security")) or []
    schemes = (document.get("components") or {}).get("securitySchemes") or {}
    resolver = _Resolver(document)
    for requirement in requirements:
        for name in requirement:
            scheme = resolver.resolve(schemes.get(name) or {})
            if scheme.get("type") == "apiKey" and scheme.get("in") == "header":
                return f"header:{scheme.get('name')}"
    return "bearer"


def _write_class(tool: tool_pb2.Tool, op: Operation, spec: ImportSpec, key_header: str) -> None:
    """Fill in the write's class as stated, or (dry run) as proposed; refuse a write without."""
    stated = spec.classes.get(op.name)
    if stated is None or stated.idempotency == tool_pb2.IDEMPOTENCY_CLASS_UNSPECIFIED:
        if not spec.dry_run:
            hint = f" (it documents {key_header}: provider_key is proposed)" if key_header else ""
            raise InvalidArgument(
                f"classes[{op.name}]",
                f"{op.method.upper()} {op.path} is a write: state its idempotency class "
                f"(provider_key, lookup or none){hint}",
            )
        if key_header:  # the proposal a dry run shows
            tool.idempotency = tool_pb2.IDEMPOTENCY_CLASS_PROVIDER_KEY
            tool.idempotency_header = key_header
        return
    tool.idempotency = stated.idempotency
    tool.key_retention_hours = stated.key_retention_hours
    if stated.idempotency == tool_pb2.IDEMPOTENCY_CLASS_PROVIDER_KEY:
        tool.idempotency_header = stated.idempotency_header or key_header or "Idempotency-Key"
    elif stated.idempotency == tool_pb2.IDEMPOTENCY_CLASS_LOOKUP:
        tool.lookup.CopyFrom(stated.lookup)
