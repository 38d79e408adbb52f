"""A remote MCP server's tools/list as registry proposals, the diff against the registry,
and which proposals may be saved.

`snapshot` asks the server (streamable HTTP) for its tools and proposes one registry
entry per tool: named `<server_id>__<tool>` (sanitized to what a model can call), its
description and input schema, a read if the server marks it `readOnlyHint`, else a write.
The annotations only *propose* a write's idempotency class (`idempotentHint`: the server
dedupes, so `provider_key`; otherwise `none`); hints are not guarantees, so no write is
saved until a person confirms its class (`confirm`), and a `provider_key` write names the
argument the server dedupes on (`McpTarget.key_argument`), which the executor fills with
the call's key and the model never sees.

`diff` compares the proposals with the registry's current entries of the server by what
the server decides (description, schema, annotations, access, URL, timeout); a person's
confirmed class carries over while the tool's schema still has its key argument and its
annotations (the hints a class rests on) are unchanged. A tool the server no longer lists
is `removed`: applying retires it (a new registry version marked `retired`, no longer
offered; the versions agent versions pinned stay as they are). `digest` names one diff, so
a caller can apply exactly the diff it was shown.

The server's URL is the workspace's data: the control plane asks it only through the
network guard (ground/netguard.py), as the executor calls it.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import importlib
import json
import logging
import re
import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from agentrun.v1 import tool_pb2
from control_plane.ground.errors import InvalidArgument
from ground import netguard

if TYPE_CHECKING:
    from mcp.types import Tool as McpTool

READ, WRITE = tool_pb2.TOOL_ACCESS_READ, tool_pb2.TOOL_ACCESS_WRITE
PROVIDER_KEY = tool_pb2.IDEMPOTENCY_CLASS_PROVIDER_KEY
NONE = tool_pb2.IDEMPOTENCY_CLASS_NONE
UNSPECIFIED = tool_pb2.IDEMPOTENCY_CLASS_UNSPECIFIED
ADDED, CHANGED, REMOVED = (
    tool_pb2.ToolChange.KIND_ADDED,
    tool_pb2.ToolChange.KIND_CHANGED,
    tool_pb2.ToolChange.KIND_REMOVED,
)
SEPARATOR = "__"
MAX_NAME = 64
MAX_TOOLS = 500
SNAPSHOT_TIMEOUT_SECONDS = 15.0
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_loading = threading.Lock()
_loaded: list[bool] = []


class McpUnreachable(Exception):
    """The server could not be asked for its tools; the message says why (never a token)."""


@dataclass(frozen=True)
class Confirmed:
    """Proposals split by whether they may be saved."""

    ready: list[tool_pb2.Tool]
    pending: list[tool_pb2.ToolChange]
    retired: list[tool_pb2.Tool]


def registry_name(server_id: str, tool: str) -> str:
    """`<server_id>__<tool>`, only letters, digits, '_' and '-', at most 64 characters
    (a long one keeps a hash of the full name, so two long names stay apart)."""
    name = _UNSAFE.sub("_", f"{server_id}{SEPARATOR}{tool}")
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: MAX_NAME - 9]}_{digest}"


async def snapshot(
    url: str,
    headers: Mapping[str, str] | None,
    *,
    server_id: str,
    connection: str = "",
    call_timeout: float = 0.0,
    timeout: float = SNAPSHOT_TIMEOUT_SECONDS,  # noqa: ASYNC109 (the whole session's deadline)
) -> list[tool_pb2.Tool]:
    """The server's tools/list as proposals (writes carry their *proposed* class; each its
    calls' deadline `call_timeout`, 0: the platform default)."""
    refusals: list[int] = []
    await _load_sdk()
    try:
        with anyio.fail_after(timeout):
            listed = await _list_tools(url, headers, refusals)
    except Exception as exc:  # noqa: BLE001 - the SDK's failures arrive in exception groups
        raise McpUnreachable(_why(_leaf(exc), url, timeout, refusals)) from exc
    proposals = [_proposal(t, server_id, url, connection) for t in listed]
    for proposal in proposals:
        proposal.mcp.timeout_seconds = call_timeout
    return proposals


async def _list_tools(
    url: str, headers: Mapping[str, str] | None, refusals: list[int]
) -> list[McpTool]:
    import httpcore2
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async def on_response(response: httpx2.Response) -> None:
        if response.status_code >= 400:
            refusals.append(response.status_code)

    http = httpx2.AsyncClient(
        headers=dict(headers or {}),
        timeout=httpx2.Timeout(None),  # bounded by the snapshot's timeout
        event_hooks={"response": [on_response]},
        transport=netguard.guard(httpx2.AsyncHTTPTransport(), httpcore2.ConnectError),
    )
    tools: list[McpTool] = []
    async with http, Client(streamable_http_client(url, http_client=http), cache=None) as client:
        cursor: str | None = None
        while len(tools) < MAX_TOOLS:
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
    return tools[:MAX_TOOLS]


async def _load_sdk() -> None:
    """The SDK takes seconds to import (it would double the control plane's start): loaded
    when a server is first asked, in a thread so the event loop goes on meanwhile."""
    if not _loaded:
        await asyncio.to_thread(_import_sdk)


def _import_sdk() -> None:
    with _loading:  # a second caller waits here rather than meet a half-initialised module
        if not _loaded:
            importlib.import_module("mcp.client.streamable_http")
            logging.getLogger("httpx2").setLevel(logging.WARNING)  # no line per request
            _loaded.append(True)


def _proposal(tool: McpTool, server_id: str, url: str, connection: str) -> tool_pb2.Tool:
    hints = tool.annotations
    read = bool(hints and hints.read_only_hint)
    proposed = tool_pb2.Tool(
        name=registry_name(server_id, tool.name),
        description=(tool.description or tool.title or "")[:4000],
        parameters_json=json.dumps(tool.input_schema, sort_keys=True),
        access=READ if read else WRITE,
        connection=connection,
        mcp=tool_pb2.McpTarget(
            server_id=server_id, tool=tool.name, url=url, annotations_json=_hints(hints)
        ),
        source="mcp",
    )
    if not read:
        proposed.idempotency = PROVIDER_KEY if hints and hints.idempotent_hint else NONE
    return proposed


def _hints(hints: object) -> str:
    """The annotations a class rests on, as sorted JSON ("" when the server gives none)."""
    dump = getattr(hints, "model_dump", None)
    if dump is None:
        return ""
    given = {k: v for k, v in dump(by_alias=True, exclude_none=True).items() if k.endswith("Hint")}
    return json.dumps(given, sort_keys=True) if given else ""


def diff(
    current: Sequence[tool_pb2.Tool],
    proposed: Sequence[tool_pb2.Tool],
    *,
    restated: Collection[str] = (),
) -> list[tool_pb2.ToolChange]:
    """What saving the proposals would change: added, changed (which fields), removed.

    A write named in `restated` (registry or server tool name: a person states its class
    again) is a change of its "class" even when the server changed nothing about it."""
    now = {t.name: t for t in current}
    changes = []
    for tool in proposed:
        before = now.pop(tool.name, None)
        fields = _changed_fields(before, tool) if before is not None else []
        if (
            before is not None
            and tool.access == WRITE
            and {tool.name, tool.mcp.tool} & set(restated)
        ):
            fields = fields or ["class"]
        if before is not None and not fields:
            continue
        change = tool_pb2.ToolChange(
            kind=CHANGED if before else ADDED, name=tool.name, proposed=tool, fields=fields
        )
        if tool.access == WRITE:
            change.proposed_class = tool.idempotency
            change.needs_class = _carried(before, tool) is None
        changes.append(change)
    for name in sorted(now):
        changes.append(tool_pb2.ToolChange(kind=REMOVED, name=name, proposed=retired(now[name])))
    return changes


def retired(tool: tool_pb2.Tool) -> tool_pb2.Tool:
    """The registry entry as its retired version (what applying a removal saves)."""
    saved = tool_pb2.Tool()
    saved.CopyFrom(tool)
    saved.retired = True
    return saved


def digest(changes: Sequence[tool_pb2.ToolChange]) -> str:
    """A short name of this diff: what changes and how, not who asks or when."""
    sha = hashlib.sha256()
    for change in changes:
        proposed = tool_pb2.Tool()
        proposed.CopyFrom(change.proposed)
        for name in ("version", "create_time", "created_by"):
            proposed.ClearField(name)  # type: ignore[arg-type]
        sha.update(f"{change.kind}:{change.name}:{','.join(change.fields)}:".encode())
        sha.update(proposed.SerializeToString(deterministic=True))
    return sha.hexdigest()[:16]


def confirm(
    changes: Sequence[tool_pb2.ToolChange],
    current: Sequence[tool_pb2.Tool],
    classes: Mapping[str, tool_pb2.WriteClass],
) -> Confirmed:
    """The proposals that may be saved (reads; writes with a class from `classes`, keyed
    by registry or server tool name, or carried over from the registry) and the pending
    writes. A class for no write of the diff is refused, naming it."""
    _check_classes_known(changes, current, classes)
    now = {t.name: t for t in current}
    ready, pending, gone = [], [], []
    for change in changes:
        if change.kind == REMOVED:
            gone.append(change.proposed)
            continue
        tool = change.proposed
        if tool.access == READ:
            ready.append(tool)
            continue
        stated = _class_for(classes, tool)
        saved = _classed(tool, stated) if stated else _carried(now.get(tool.name), tool)
        if saved is None:
            pending.append(_pending(change))
        else:
            ready.append(saved)
    return Confirmed(ready, pending, gone)


def _check_classes_known(
    changes: Sequence[tool_pb2.ToolChange],
    current: Sequence[tool_pb2.Tool],
    classes: Mapping[str, tool_pb2.WriteClass],
) -> None:
    writes = {
        name
        for tool in [*(c.proposed for c in changes if c.kind != REMOVED), *current]
        if tool.access == WRITE
        for name in (tool.name, tool.mcp.tool)
    }
    for name in classes:
        if name not in writes:
            raise InvalidArgument(f"classes[{name}]", "names no write tool of this server")


def _class_for(
    classes: Mapping[str, tool_pb2.WriteClass], tool: tool_pb2.Tool
) -> tool_pb2.WriteClass | None:
    for name in (tool.name, tool.mcp.tool):
        if name in classes:
            return classes[name]
    return None


def _classed(tool: tool_pb2.Tool, stated: tool_pb2.WriteClass) -> tool_pb2.Tool:
    """The write with a person's class; provider_key names the argument the server dedupes
    on (WriteClass.idempotency_header), which leaves the schema the model sees."""
    field = f"classes[{tool.mcp.tool}]"
    saved = _bare(tool)
    if stated.idempotency == NONE:
        saved.idempotency = NONE
        return saved
    if stated.idempotency != PROVIDER_KEY:
        raise InvalidArgument(
            f"{field}.idempotency",
            "must be PROVIDER_KEY or NONE for an MCP "
            "tool (an MCP server cannot be asked whether a call happened)",
        )
    argument = stated.idempotency_header
    if argument not in _properties(tool.parameters_json):
        raise InvalidArgument(
            f"{field}.idempotency_header",
            "must name the argument the server "
            f"dedupes on, one of the tool's arguments (got {argument!r})",
        )
    saved.idempotency = PROVIDER_KEY
    saved.key_retention_hours = stated.key_retention_hours
    saved.mcp.key_argument = argument
    saved.parameters_json = _without(tool.parameters_json, argument)
    return saved


def _carried(before: tool_pb2.Tool | None, tool: tool_pb2.Tool) -> tool_pb2.Tool | None:
    """The proposal with the class a person confirmed for the registry's entry, while it
    still applies (the entry is a write; its key argument is still in the schema; the
    server's hints are the ones the person saw)."""
    if before is None or before.access != WRITE or before.idempotency == UNSPECIFIED:
        return None
    if before.mcp.annotations_json != tool.mcp.annotations_json:
        return None
    key = before.mcp.key_argument
    if before.idempotency == PROVIDER_KEY and key not in _properties(tool.parameters_json):
        return None
    stated = tool_pb2.WriteClass(
        idempotency=before.idempotency,
        idempotency_header=key,
        key_retention_hours=before.key_retention_hours,
    )
    return _classed(tool, stated)


def _changed_fields(before: tool_pb2.Tool, tool: tool_pb2.Tool) -> list[str]:
    """The fields the server decides that differ from the registry's entry."""
    key = before.mcp.key_argument
    fields = []
    if before.description != tool.description:
        fields.append("description")
    if _schema(before.parameters_json) != _schema(_without(tool.parameters_json, key)):
        fields.append("parameters")
    if before.access != tool.access:
        fields.append("access")
    if before.mcp.annotations_json != tool.mcp.annotations_json:
        fields.append("annotations")
    if (before.mcp.url, before.mcp.tool) != (tool.mcp.url, tool.mcp.tool):
        fields.append("url")
    if before.mcp.timeout_seconds != tool.mcp.timeout_seconds:
        fields.append("timeout")
    if before.connection != tool.connection:
        fields.append("connection")
    if key and key not in _properties(tool.parameters_json):
        fields.append("key_argument")
    return fields


def _pending(change: tool_pb2.ToolChange) -> tool_pb2.ToolChange:
    pending = tool_pb2.ToolChange()
    pending.CopyFrom(change)
    pending.needs_class = True
    return pending


def _bare(tool: tool_pb2.Tool) -> tool_pb2.Tool:
    """A copy without the proposed class (a proposal is never saved with it)."""
    saved = tool_pb2.Tool()
    saved.CopyFrom(tool)
    saved.idempotency = UNSPECIFIED
    return saved


def _schema(raw: str) -> object:
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        return raw


def _properties(raw: str) -> set[str]:
    schema = _schema(raw)
    props = schema.get("properties") if isinstance(schema, dict) else None
    return set(props) if isinstance(props, dict) else set()


def _without(raw: str, argument: str) -> str:
    """The schema without `argument` (the executor fills it; the model never does)."""
    schema = _schema(raw)
    if not argument or not isinstance(schema, dict):
        return raw
    schema = copy.deepcopy(schema)
    if isinstance(schema.get("properties"), dict):
        schema["properties"].pop(argument, None)
    if isinstance(schema.get("required"), list):
        schema["required"] = [r for r in schema["required"] if r != argument]
    return json.dumps(schema, sort_keys=True)


def _why(exc: BaseException, url: str, timeout: float, refusals: list[int]) -> str:
    asked = f"the MCP server at {url}"
    if isinstance(exc, netguard.DestinationRefused):
        return f"{asked} was not asked: {exc}"
    if isinstance(exc, TimeoutError):
        return f"{asked} did not answer tools/list within {timeout:g}s"
    if refusals and refusals[-1] in (401, 403):
        return f"{asked} refused the credentials (HTTP {refusals[-1]}): check its connection"
    if refusals:
        return f"{asked} answered HTTP {refusals[-1]} when asked for its tools"
    message = getattr(exc, "message", None) or type(exc).__name__
    return f"{asked} could not be asked for its tools: {message}"


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc
