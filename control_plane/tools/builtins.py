"""The platform catalogue as the registry's shared entries (workspace '', source "builtin").

At start every replica saves each entry of the catalogue (`AGENTRUN_CATALOGUE`, else the one
shipped with the executor) as a shared tool version; an entry equal to the latest saves
nothing, a changed one becomes its next version. Built-ins need executor code (the executor's
catalogue says how to call them), so their definitions carry no transport: they are the
registry's record of what the tool is (schema, class, capability marks) for publishing and
for every workspace to list.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrun.v1 import tool_pb2
from control_plane.store import tools as store
from control_plane.store.db import Pool
from control_plane.tools import registry

log = logging.getLogger(__name__)

CREATED_BY = "platform:catalogue"
SOURCE = "builtin"
_ACCESS = {
    "read": tool_pb2.TOOL_ACCESS_READ,
    "write": tool_pb2.TOOL_ACCESS_WRITE,
    "internal": tool_pb2.TOOL_ACCESS_INTERNAL,
}
CLASSES = {
    "provider_key": tool_pb2.IDEMPOTENCY_CLASS_PROVIDER_KEY,
    "lookup": tool_pb2.IDEMPOTENCY_CLASS_LOOKUP,
    "none": tool_pb2.IDEMPOTENCY_CLASS_NONE,
}


def from_catalogue(entry: Mapping[str, Any], retention: float | None) -> tool_pb2.Tool:
    """One catalogue entry as a shared registry entry."""
    capabilities = list(entry.get("capabilities", ()))
    if entry.get("moves_money") and "moves_money" not in capabilities:
        capabilities.append("moves_money")
    tool = tool_pb2.Tool(
        name=entry["name"],
        description=entry["description"],
        parameters_json=json.dumps(entry["parameters"], sort_keys=True),
        access=_ACCESS[entry["kind"]],
        connection=entry["provider"],
        rate_bucket=entry.get("rate_bucket") or "",
        scopes=entry["scopes"],
        capabilities=capabilities,
        needs_approval=entry["needs_approval"],
        builtin=True,
    )
    if entry["kind"] == "write":
        tool.idempotency = CLASSES[entry["idempotency"] or "none"]
        tool.key_retention_hours = retention or 0.0
    if lookup := entry.get("lookup"):
        tool.lookup.CopyFrom(
            tool_pb2.ToolLookup(
                stamp_body_field=lookup["stamp"]["body_field"],
                stamp_name=lookup["stamp"]["name"],
                url=lookup["path"],
                query=lookup["query"],
                matches=lookup["matches"],
                settle_seconds=float(lookup.get("settle_seconds", 1.0)),
            )
        )
    return tool


def load(path: str | Path | None = None) -> list[tool_pb2.Tool]:
    """The catalogue's entries as shared registry entries."""
    data = json.loads(Path(registry.catalogue_path(path)).read_text())
    retention = {name: p.get("key_retention_hours") for name, p in data["providers"].items()}
    return [from_catalogue(t, retention.get(t["provider"])) for t in data["tools"]]


async def sync(pool: Pool, path: str | Path | None = None) -> int:
    """Save the catalogue as shared entries; how many versions were new."""
    saved = 0
    for tool in load(path):
        _, created = await store.save_tool_version(pool, store.SHARED, tool, CREATED_BY, SOURCE)
        saved += created
    if saved:
        log.info("tool registry: %d built-in tool versions saved from the catalogue", saved)
    return saved
