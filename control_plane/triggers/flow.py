"""Flow control on triggers: debounce and batching (Inngest's, on our event table).

A trigger's config may hold `debounce {key, quiet_seconds}` or `batch {max_events,
max_seconds}`. Its events are still recorded once per dedupe key, but `pending`
with no run, in a group (store/flow.py, migration 0022): a debounce groups by the
value of its key (a dotted path into the body, or `header:<name>`), a batch has
one group per trigger. A debounce is due once its key has been quiet for
quiet_seconds; a batch once it holds max_events or its group has waited
max_seconds.

The scheduler loop calls `flush_due`: one transaction locks due groups (SKIP
LOCKED, so replicas share the work), and for each admits one run (the admission
path every trigger uses, `run_admit`) and marks the events it holds accepted
with that run. A debounce's run carries its last event; a batch's run holds each
of its events once. A crash before the commit leaves the events pending and the
group due; after it, nothing is pending to flush twice.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import faults
from control_plane.ground.config import RunDefaults
from control_plane.ground.errors import FailedPrecondition, InvalidArgument
from control_plane.runs import concurrency_keys
from control_plane.store import agents as agent_store
from control_plane.store import flow as flow_store
from control_plane.store import triggers as store
from control_plane.store.admission import admission
from control_plane.triggers import filters

log = logging.getLogger(__name__)

MAX_QUIET_SECONDS = 7 * 24 * 3600
MAX_BATCH_EVENTS = 1000
MAX_BATCH_SECONDS = 24 * 3600
HEADER = "header:"
# What filters.lookup answers for a path the document lacks.
_ABSENT = filters.lookup({}, "absent")


def config(field: str, debounce: Any, batch: Any) -> dict[str, Any]:
    """The config entries of a source's debounce and batch messages (unset: none); bad values
    raise InvalidArgument naming `<field>.debounce.…` or `<field>.batch.…`."""
    out: dict[str, Any] = {}
    if debounce.key or debounce.quiet_seconds:
        key = debounce.key.strip()
        path = key[len(HEADER) :] if key.startswith(HEADER) else key
        if not path or len(key) > 200 or (not key.startswith(HEADER) and " " in path):
            raise InvalidArgument(f"{field}.debounce.key", "must be a dotted path or header:<name>")
        if not 1 <= debounce.quiet_seconds <= MAX_QUIET_SECONDS:
            raise InvalidArgument(
                f"{field}.debounce.quiet_seconds", f"must be 1 to {MAX_QUIET_SECONDS}"
            )
        out["debounce"] = {"key": key, "quiet_seconds": debounce.quiet_seconds}
    if batch.max_events or batch.max_seconds:
        if not 2 <= batch.max_events <= MAX_BATCH_EVENTS:
            raise InvalidArgument(f"{field}.batch.max_events", f"must be 2 to {MAX_BATCH_EVENTS}")
        if not 1 <= batch.max_seconds <= MAX_BATCH_SECONDS:
            raise InvalidArgument(f"{field}.batch.max_seconds", f"must be 1 to {MAX_BATCH_SECONDS}")
        out["batch"] = {"max_events": batch.max_events, "max_seconds": batch.max_seconds}
    if len(out) == 2:
        raise InvalidArgument(f"{field}.batch", "a trigger debounces or batches, not both")
    return out


def debounce_value(key: str, headers: Mapping[str, str], doc: Any) -> str:
    """The event's value of the debounce key ('' when it has none: those debounce together)."""
    if key.startswith(HEADER):
        return headers.get(key[len(HEADER) :].lower(), "").strip()
    value = filters.lookup(doc, key)
    return "" if value is _ABSENT else filters.as_text(value)


def pending(
    config: Mapping[str, Any],
    workspace_id: str,
    trigger_id: str,
    dedupe_key: str,
    headers: Mapping[str, str],
    doc: Any,
) -> flow_store.PendingEvent | None:
    """The event as held for its group, or None when the trigger neither debounces nor
    batches."""
    common = {
        "workspace_id": workspace_id,
        "trigger_id": trigger_id,
        "dedupe_key": dedupe_key,
        "payload": doc,
    }
    if deb := config.get("debounce"):
        value = debounce_value(deb["key"], headers, doc)[:512]
        return flow_store.PendingEvent(
            **common,
            flow_key=value,
            mode="debounce",
            wait_seconds=deb["quiet_seconds"],
            max_events=0,
        )
    if bat := config.get("batch"):
        return flow_store.PendingEvent(
            **common,
            flow_key="",
            mode="batch",
            wait_seconds=bat["max_seconds"],
            max_events=bat["max_events"],
        )
    return None


def webhook_text(trigger_id: str, scheme: str | None, key: str, doc: Any) -> str:
    body = json.dumps(doc, indent=2, ensure_ascii=False, sort_keys=True)
    return f"Webhook delivery {key} to trigger {trigger_id} ({scheme}):\n{body}"


def _payload(group: Any, events: list[Any]) -> dict[str, Any]:
    """The run's input step: a debounce's last event, or every event of a batch."""
    from control_plane.triggers.admission import clip

    origin: dict[str, Any] = {"trigger_id": group["trigger_id"], "kind": group["kind"]}
    if group["mode"] == "debounce":
        last = events[-1]
        origin |= {
            "dedupe_key": last["dedupe_key"],
            "chain_depth": 0,
            "debounce": {"key": group["flow_key"], "events": len(events)},
        }
        doc = json.loads(last["payload"])
        text = webhook_text(group["trigger_id"], group["scheme"], last["dedupe_key"], doc)
        return {"text": clip(text), "trigger": origin}
    held = [{"dedupe_key": e["dedupe_key"], "payload": json.loads(e["payload"])} for e in events]
    origin["batch"] = {"events": len(events), "dedupe_keys": [e["dedupe_key"] for e in events]}
    text = f"Batch of {len(events)} deliveries to trigger {group['trigger_id']}:\n"
    return {"text": clip(text + json.dumps(held, ensure_ascii=False)), "trigger": origin}


async def _flush(conn: store.Connection, group: Any, defaults: RunDefaults) -> bool:
    """Admit the group's run and consume its events; settle what is left."""
    cfg = json.loads(group["config"]) if isinstance(group["config"], str) else group["config"]
    size = cfg["batch"]["max_events"] if group["mode"] == "batch" else 1_000_000
    wait = (cfg.get("batch") or cfg.get("debounce") or {}).get(
        "max_seconds" if group["mode"] == "batch" else "quiet_seconds", 1
    )
    events = await flow_store.take(conn, group, size)
    started = False
    if events:
        ws, agent = group["workspace_id"], group["agent_id"]
        version = await agent_store.get_version(conn, ws, agent, 0)
        if version is None:
            raise FailedPrecondition(f"agent {agent!r} has no published version")
        payload = _payload(group, events)
        key = f"flow:{group['trigger_id']}:{group['flow_key']}:{events[0]['flow_seq']}"
        adm = admission(
            version,
            defaults,
            payload["text"],
            input_payload=payload,
            started_by=f"trigger:{group['trigger_id']}",
            request_id=key[:512],
            priority=int(cfg.get("priority", 0)),
            # Keyed by the event it carries: a debounce's last, a batch's first.
            key_rule=concurrency_keys.trigger_rule(
                cfg.get("concurrency_key"),
                json.loads(events[-1 if group["mode"] == "debounce" else 0]["payload"]),
            ),
        )
        started = await flow_store.consume(conn, [e["event_id"] for e in events], adm, None) > 0
    faults.point("control_plane.trigger_flow.before_commit")
    await flow_store.settle(conn, group, size, int(wait), group["db_now"])
    return started


async def flush_due(
    pool: store.Pool,
    defaults: RunDefaults,
    on_runnable: Callable[[], None],
    now: datetime | None = None,
    limit: int = 100,
) -> int:
    """Flush up to `limit` due groups, a transaction per workspace, the longest overdue
    first (on Citus each stays on one shard); how many runs it started."""
    started = flushed = 0
    for workspace_id in await flow_store.due_workspaces(pool, limit, now):
        if flushed >= limit:
            break
        async with store.transaction(pool) as conn:
            groups = await flow_store.claim_due(conn, workspace_id, limit - flushed, now)
            flushed += len(groups)
            for group in groups:
                started += await _flush_isolated(conn, group, defaults)
    if started:
        on_runnable()
    return started


async def _flush_isolated(conn: store.Connection, group: Any, defaults: RunDefaults) -> int:
    """Flush one group inside a savepoint, so one cannot stop the rest; runs started."""
    try:
        async with store.transaction(conn):
            return await _flush(conn, group, defaults)
    except Exception as exc:  # noqa: BLE001 - logged; the group stays due
        log.error(
            "trigger %s/%s could not flush %s group %r: %s",
            group["workspace_id"],
            group["trigger_id"],
            group["mode"],
            group["flow_key"],
            exc,
        )
        return 0
