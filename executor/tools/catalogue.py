"""The integration catalogue: which tools exist, how to call them, how to retry them.

Every tool declares its argument schema (checked before anything is
committed), whether it reads or writes, and for writes its idempotency class:

* ``provider_key`` — the provider deduplicates by our ``Idempotency-Key``
  (or, like a CRM upsert, by the record's own identity): send again, same key;
* ``lookup`` — no dedupe, but the provider can say whether the action with
  our key happened (the key is stamped into the request, e.g. a mail header);
* ``none`` — neither: an unknown outcome is never retried, a person decides.

Each provider records how long it keeps keys (``key_retention_hours``, null
for never-expiring); a key older than that is resolved as class ``none``.
The file is ``catalogue.json`` beside this module, or ``AGENTRUN_CATALOGUE``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator

from executor.tools import template
from executor.tools.rejection import ToolCallRejected
from executor.tools.template import HttpTemplate

DEFAULT_PATH = Path(__file__).with_name("catalogue.json")
PATH_VARIABLE = "AGENTRUN_CATALOGUE"

# What a tool can do, for least privilege: with all of the first three an agent can be
# talked into exfiltrating (the lethal trifecta), checked when a version is published.
CAPABILITIES = ("reads_private", "reads_untrusted", "communicates_externally", "moves_money")

# The shape of one catalogue entry; a bad catalogue fails at load, not mid-run.
_LOOKUP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["stamp", "method", "path", "query", "matches"],
    "properties": {
        "stamp": {
            "type": "object",
            "required": ["body_field", "name"],
            "properties": {"body_field": {"type": "string"}, "name": {"type": "string"}},
            "additionalProperties": False,
        },
        "method": {"const": "GET"},
        "path": {"type": "string"},
        "query": {"type": "object", "additionalProperties": {"type": "string"}},
        "matches": {"type": "string"},
        "settle_seconds": {"type": "number", "minimum": 0, "maximum": 60},
    },
    "additionalProperties": False,
}
_TOOL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": [
        "name",
        "description",
        "provider",
        "method",
        "path",
        "kind",
        "idempotency",
        "parameters",
        "scopes",
        "moves_money",
        "needs_approval",
        "rate_bucket",
    ],
    "properties": {
        "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
        "description": {"type": "string"},
        "provider": {"type": "string"},
        "method": {"enum": ["GET", "POST", "PUT", "PATCH", "DELETE", None]},
        "path": {"type": ["string", "null"]},
        "kind": {"enum": ["read", "write", "internal"]},
        "idempotency": {"enum": ["provider_key", "lookup", "none", None]},
        "lookup": {"oneOf": [{"type": "null"}, _LOOKUP_SCHEMA]},
        "parameters": {"type": "object"},
        "scopes": {"type": "array", "items": {"type": "string"}},
        "moves_money": {"type": "boolean"},
        "needs_approval": {"type": "boolean"},
        "rate_bucket": {"type": ["string", "null"]},
        "version": {"type": "string", "minLength": 1, "maxLength": 40},
        "capabilities": {"type": "array", "items": {"enum": list(CAPABILITIES)}},
        "chain_marker": {"type": ["string", "null"]},
    },
    "additionalProperties": False,
}


@dataclass(frozen=True)
class Lookup:
    """How to ask a `lookup`-class provider whether the action with our key happened.

    The key is stamped into the request body (`body_field[name] = key`), and a
    GET of `path` with `query` (`{key}` replaced) answers with a list under
    `matches`: empty means it did not happen. `settle_seconds` is how long to
    let a request that timed out finish at the provider before asking.
    """

    body_field: str
    header_name: str
    path: str
    query: Mapping[str, str]
    matches: str
    settle_seconds: float = 1.0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Lookup:
        return cls(
            body_field=data["stamp"]["body_field"],
            header_name=data["stamp"]["name"],
            path=data["path"],
            query=dict(data["query"]),
            matches=data["matches"],
            settle_seconds=float(data.get("settle_seconds", 1.0)),
        )

    def query_for(self, key: str) -> dict[str, str]:
        return {name: value.replace("{key}", key) for name, value in self.query.items()}


@dataclass(frozen=True)
class McpTarget:
    """A tool of a registered remote MCP server (tool.proto McpTarget)."""

    server_id: str
    tool: str
    url: str
    key_argument: str = ""
    timeout_seconds: float = 0.0  # 0: the platform's (ExecutorConfig.tool_timeout_seconds)


@dataclass(frozen=True)
class Tool:
    """One catalogue entry (with its provider's key retention copied in)."""

    name: str
    description: str
    provider: str
    method: str | None
    path: str | None
    kind: str
    idempotency: str | None
    parameters: Mapping[str, Any]
    scopes: tuple[str, ...]
    moves_money: bool
    needs_approval: bool
    rate_bucket: str | None
    lookup: Lookup | None = None
    key_retention_hours: float | None = None
    version: str = "1"
    capabilities: tuple[str, ...] = ()
    # The body field where outbound mail keeps its headers: sends carry our chain marker there.
    chain_marker: str | None = None
    # A workspace's registry tool (executor/tools/definitions.py) is called from its definition:
    # an HTTP template or a remote MCP server's tool (None for built-ins: provider + path).
    http: HttpTemplate | None = None
    mcp: McpTarget | None = None
    # Registry tools: which connection supplies the token ("" none, "trigger" the run's
    # triggering account, else a provider name spec.connections maps). None for built-ins,
    # which act as spec.connections[provider].
    connection: str | None = None
    # provider_key: the header carrying our key.
    idempotency_header: str = "Idempotency-Key"

    @property
    def schema_sha256(self) -> str:
        """SHA-256 (hex) of the canonical JSON of the argument schema."""
        canonical = json.dumps(self.parameters, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @functools.cached_property
    def validator(self) -> Draft202012Validator:
        """The argument schema's validator, built once per tool: building one for every
        call (its registry and resolver with it) cost more than validating."""
        return Draft202012Validator(self.parameters)

    @property
    def call_class(self) -> str:
        """How an unknown outcome resolves: read, provider_key, lookup, none or internal."""
        if self.kind == "write":
            return self.idempotency or "none"
        return self.kind

    def openai_schema(self) -> dict[str, Any]:
        """The tool as an OpenAI `tools` entry."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }


@dataclass(frozen=True)
class Catalogue:
    """Every tool the platform knows, and each provider's idempotency-key retention."""

    tools: Mapping[str, Tool]
    key_retention_hours: Mapping[str, float | None]

    @classmethod
    def load(cls, path: Path | str | None = None) -> Catalogue:
        """The catalogue at `path`, else `$AGENTRUN_CATALOGUE`, else the shipped one."""
        chosen = path or os.environ.get(PATH_VARIABLE) or DEFAULT_PATH
        return cls.from_dict(json.loads(Path(chosen).read_text()))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Catalogue:
        providers = {
            name: entry.get("key_retention_hours") for name, entry in data["providers"].items()
        }
        tools: dict[str, Tool] = {}
        for entry in data["tools"]:
            tool = _parse_tool(entry, providers)
            if tool.name in tools:
                raise ValueError(f"catalogue: tool {tool.name!r} is defined twice")
            tools[tool.name] = tool
        return cls(tools=tools, key_retention_hours=providers)

    def get(self, name: str) -> Tool | None:
        return self.tools.get(name)

    def openai_tools(self, names: Iterable[str]) -> list[dict[str, Any]]:
        """OpenAI tool definitions for the allowed names that exist, in the given order."""
        return [self.tools[n].openai_schema() for n in names if n in self.tools]

    def check_call(
        self,
        name: str,
        arguments: Mapping[str, Any] | None,
        allowed: Iterable[str],
        arguments_raw: str | None = None,
    ) -> Tool:
        """Return the tool if this call may be sent, else raise ToolCallRejected saying why."""
        tool = self.tools.get(name)
        if tool is None:
            raise ToolCallRejected(f"unknown tool: {name!r}")
        if name not in set(allowed):
            raise ToolCallRejected(f"tool {name!r} is not allowed for this agent")
        if arguments is None:
            raw = (arguments_raw or "")[:200]
            raise ToolCallRejected(f"arguments for {name} are not valid JSON: {raw!r}")
        errors = sorted(
            tool.validator.iter_errors(dict(arguments)),
            key=lambda e: list(e.absolute_path),
        )
        if errors:
            details = "; ".join(_describe(e) for e in errors[:3])
            raise ToolCallRejected(f"invalid arguments for {name}: {details}")
        if tool.http is not None:  # a registry tool: the request must be possible to build
            template.render(tool.http, arguments)
        return tool


def _describe(error: jsonschema.ValidationError) -> str:
    where = ".".join(str(p) for p in error.absolute_path)
    return f"{where}: {error.message}" if where else error.message


def _parse_tool(entry: Mapping[str, Any], providers: Mapping[str, Any]) -> Tool:
    name = entry.get("name", "?")
    try:
        jsonschema.validate(entry, _TOOL_SCHEMA)
        Draft202012Validator.check_schema(entry["parameters"])
    except jsonschema.SchemaError as exc:
        raise ValueError(f"catalogue: tool {name!r}: bad parameters schema: {exc.message}") from exc
    except jsonschema.ValidationError as exc:
        raise ValueError(f"catalogue: tool {name!r}: {exc.message}") from exc
    _check_consistency(entry, providers)
    fields = {
        **entry,
        "scopes": tuple(entry["scopes"]),
        "capabilities": tuple(entry.get("capabilities", ())),
        "lookup": Lookup.from_dict(entry["lookup"]) if entry.get("lookup") else None,
        "key_retention_hours": providers[entry["provider"]],
    }
    return Tool(**fields)


def _check_consistency(entry: Mapping[str, Any], providers: Mapping[str, Any]) -> None:
    """What the JSON schema cannot say: fields that depend on each other."""
    name = entry["name"]
    if entry["provider"] not in providers:
        raise ValueError(f"catalogue: tool {name!r}: unknown provider {entry['provider']!r}")
    if entry["kind"] == "write" and entry["idempotency"] is None:
        raise ValueError(f"catalogue: write tool {name!r} needs an idempotency class")
    if entry["kind"] != "write" and entry["idempotency"] is not None:
        raise ValueError(f"catalogue: tool {name!r}: only writes have an idempotency class")
    if (entry["idempotency"] == "lookup") != bool(entry.get("lookup")):
        raise ValueError(f"catalogue: tool {name!r}: class lookup and a lookup spec go together")
    # The executor answers its own tools (provider "internal"): no HTTP endpoint.
    if entry["provider"] != "internal" and not (entry["method"] and entry["path"]):
        raise ValueError(f"catalogue: tool {name!r} needs a method and a path")
