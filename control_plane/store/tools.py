"""The tool registry (migrations/0024_tools.sql): immutable versions of each workspace's
tools beside the platform's shared built-in entries (workspace_id '').

A definition is stored as the agentrun.v1.Tool message in JSON without the fields the row's
key and columns hold; saving one equal to the latest version saves nothing. A workspace's own
tool shadows a shared one of the same name for that workspace only, and no query here ever
returns another workspace's entry.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import asyncpg
from google.protobuf import json_format

from agentrun.v1 import tool_pb2
from control_plane.store.db import transaction
from control_plane.store.queries import run

SHARED = ""  # the workspace_id of the platform's built-in entries
# Fields the row holds itself: never part of the stored definition (nor of its equality).
ROW_FIELDS = ("workspace_id", "name", "version", "builtin", "create_time", "created_by", "source")

Db: TypeAlias = asyncpg.pool.Pool | asyncpg.Connection


@dataclass(frozen=True)
class Pin:
    """One registry entry an agent version was published with."""

    name: str
    workspace_id: str  # SHARED or the version's own workspace
    version: int

    @property
    def builtin(self) -> bool:
        return self.workspace_id == SHARED

    def to_json(self) -> dict[str, Any]:
        return {"workspace_id": self.workspace_id, "version": self.version}


def definition(tool: tool_pb2.Tool) -> dict[str, Any]:
    """The stored JSON of a tool: every field but those of the row."""
    bare = tool_pb2.Tool()
    bare.CopyFrom(tool)
    for name in ROW_FIELDS:
        bare.ClearField(name)  # type: ignore[arg-type]
    return json_format.MessageToDict(bare, preserving_proto_field_name=True)


def to_proto(row: Mapping[str, Any]) -> tool_pb2.Tool:
    """A registry row as the Tool message (workspace_id '' and builtin for shared entries)."""
    raw = row["definition"]
    tool = json_format.ParseDict(
        json.loads(raw) if isinstance(raw, str) else raw,
        tool_pb2.Tool(),
        ignore_unknown_fields=True,
    )
    tool.workspace_id = row["workspace_id"]
    tool.name = row["name"]
    tool.version = row["version"]
    tool.builtin = row["workspace_id"] == SHARED
    tool.source = row["source"]
    tool.created_by = row["created_by"]
    tool.create_time.FromDatetime(row["created_at"])
    return tool


async def save_tool_version(
    db: Db, workspace_id: str, tool: tool_pb2.Tool, created_by: str, source: str
) -> tuple[tool_pb2.Tool, bool]:
    """Save `tool` as the next version of its name in `workspace_id` (SHARED: a built-in).

    Idempotent: a definition equal to the latest version saves nothing and returns that
    version with created False. The caller validated it (control_plane/tools/definitions.py).
    """
    stored = definition(tool)
    async with transaction(db) as conn:
        await run(conn, "tool_lock", workspace_id, tool.name)
        latest = await run(conn, "tool_latest", workspace_id, tool.name)
        if latest is not None and json.loads(latest["definition"]) == stored:
            return to_proto(latest), False
        version = (latest["version"] if latest is not None else 0) + 1
        row = await run(
            conn,
            "tool_insert",
            workspace_id,
            tool.name,
            version,
            json.dumps(stored),
            source,
            created_by,
        )
    return to_proto(row), True


async def get_tool(db: Db, workspace_id: str, name: str, version: int = 0) -> tool_pb2.Tool | None:
    """Version `version` (0: the latest) of `name` as the workspace sees it, or None: its
    own entry of that name shadows a shared one."""
    row = await run(db, "tool_get", workspace_id, name, version)
    return to_proto(row) if row is not None else None


async def list_tools(
    db: Db, workspace_id: str, after: str | None = None, limit: int = 1000
) -> list[tool_pb2.Tool]:
    """The latest version of every tool the workspace sees, by name, after `after`."""
    return [to_proto(r) for r in await run(db, "tool_list", workspace_id, after, limit)]


async def resolve(db: Db, workspace_id: str, names: Sequence[str]) -> dict[str, tool_pb2.Tool]:
    """The latest version of each of `names` the workspace sees (missing names left out)."""
    found: dict[str, tool_pb2.Tool] = {}
    for name in names:
        tool = await get_tool(db, workspace_id, name)
        if tool is not None:
            found[name] = tool
    return found


async def pinned(db: Db, workspace_id: str, pins: Sequence[Pin]) -> list[tool_pb2.Tool]:
    """The definitions of these pins, only from the workspace itself or the shared entries."""
    if not pins:
        return []
    rows = await run(
        db,
        "tool_pinned",
        workspace_id,
        [p.name for p in pins],
        [p.workspace_id for p in pins],
        [p.version for p in pins],
    )
    return [to_proto(r) for r in rows]


def pins_from_json(raw: str | Mapping[str, Any] | None) -> list[Pin]:
    """The pins an agent_versions.tool_versions value holds (NULL: none)."""
    if raw is None:
        return []
    data = json.loads(raw) if isinstance(raw, str) else raw
    return [Pin(name, str(p["workspace_id"]), int(p["version"])) for name, p in data.items()]
