"""Tools as files: a YAML (or JSON) document that says everything a registry Tool holds.

    name: channel_history
    description: The latest posts of a chat channel.
    access: read                      # read | write
    parameters:                       # JSON Schema of the arguments
      type: object
      properties: {channel: {type: string}, limit: {type: integer}}
      required: [channel]
    connection: chat                  # who supplies the token (a provider spec.connections maps)
    http:
      method: GET
      url: https://chat.example/channels/{channel}/messages
      query: {limit: "{limit}"}
      auth: bearer                    # bearer | header:<Name>
      response_pointer: /messages

A write says its class: `idempotency: provider_key` (with `idempotency_header`),
`lookup` (with `lookup: {...}`) or `none`. Field names are the proto's (tool.proto);
`parameters` is the schema as a mapping (or `parameters_json` as text) and an `http.body`
template may be a mapping. A file holds one tool, or `tools: [...]` several. A key the Tool
does not have is an error naming it (and the nearest known key).
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from google.protobuf import json_format

from agentrun.v1 import tool_pb2
from agentrun_cli.spec_files import SpecFileError, read_text, unknown_keys

_ACCESS = {"read": "TOOL_ACCESS_READ", "write": "TOOL_ACCESS_WRITE"}
_CLASSES = {
    "provider_key": "IDEMPOTENCY_CLASS_PROVIDER_KEY",
    "lookup": "IDEMPOTENCY_CLASS_LOOKUP",
    "none": "IDEMPOTENCY_CLASS_NONE",
}
FILE_KEYS = {"parameters"}


class ToolFileError(SpecFileError):
    """The file cannot be read as tools; the message names the file and what is wrong (an
    AgentFileError: a tool inside an agent file is one, and the CLI reports both alike)."""


def load(path: str) -> list[tool_pb2.Tool]:
    """The tools of a file (`-` reads standard input)."""
    try:
        text = read_text(path)
        doc = yaml.safe_load(text)
    except (OSError, yaml.YAMLError) as err:
        raise ToolFileError(f"{path}: cannot read it: {err}") from None
    except RecursionError:  # the reader recurses once a level
        raise ToolFileError(f"{path}: cannot read it: nested too deeply") from None
    if isinstance(doc, dict) and set(doc) == {"tools"} and isinstance(doc["tools"], list):
        return [parse(item, f"{path}: tools[{i}]") for i, item in enumerate(doc["tools"])]
    return [parse(doc, path)]


def parse(doc: Any, source: str = "tool file") -> tool_pb2.Tool:
    """One tool's document as the Tool message (checked again by the server when saved)."""
    if not isinstance(doc, dict):
        raise ToolFileError(f"{source}: expected a mapping of keys (name, access, http, ...)")
    fields = {k: v for k, v in doc.items() if k not in FILE_KEYS}
    unknown = unknown_keys(fields, tool_pb2.Tool.DESCRIPTOR, FILE_KEYS)
    if unknown:
        raise ToolFileError(f"{source}: unknown keys: {'; '.join(unknown)}")
    if not isinstance(doc.get("name"), str) or not doc["name"]:
        raise ToolFileError(f"{source}: `name: <tool name>` is required")
    tool = tool_pb2.Tool()
    try:
        json_format.ParseDict(_normalise(doc), tool)
    except (json_format.ParseError, ValueError, TypeError) as err:
        raise ToolFileError(f"{source}: {err}") from None
    return tool


def _normalise(doc: dict[str, Any]) -> dict[str, Any]:
    """Short enum names to full ones; the schema and a body template as JSON text."""
    out = dict(doc)
    if "parameters" in out:
        out["parameters_json"] = json.dumps(out.pop("parameters"))
    if isinstance(out.get("access"), str):
        out["access"] = _ACCESS.get(out["access"].lower(), out["access"])
    if isinstance(out.get("idempotency"), str):
        out["idempotency"] = _CLASSES.get(out["idempotency"].lower(), out["idempotency"])
    http = out.get("http")
    if isinstance(http, dict) and isinstance(http.get("body"), dict | list):
        out["http"] = {**http, "body": json.dumps(http["body"])}
    return out
