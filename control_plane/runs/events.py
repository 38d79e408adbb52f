"""Events by matching: a workspace publishes named events (RunService.PublishEvent); a run's
`wait_for_event` call gets the first that matches as its result; an agent version's
`cancel_on` events cancel its runs.

A wait is parked by the executor as wait reason "event", its park step carrying the concrete
keys (the run side of each match expression already read from the run's input:
ground/event_match.py). Here (EventWait, an effect of the commit pipeline:
dispatch/pipeline.py), in the park commit's transaction, each key becomes a row of
event_waits, indexed by (workspace, event name, key), and the stored events that the wait's
look-back window covers are checked. A publish projects the body onto the shapes in use for
its name and reads exactly the matching rows. migrations/0049_events.sql argues why no wake
is lost and none happens twice.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from agentrun.v1 import executor_pb2 as pb
from control_plane.dispatch.pipeline import Work
from control_plane.ground.errors import AlreadyExists
from control_plane.ops import run_figures
from control_plane.store import runs as run_store
from control_plane.store import steps as step_store
from control_plane.store.db import Connection, Pool, transaction
from control_plane.store.errors import deadlock
from control_plane.store.queries import run
from ground import event_match

log = logging.getLogger(__name__)

TOOL = "wait_for_event"
WAIT_REASON = "event"
MAX_BODY_BYTES = 256 * 1024
MAX_EVENT_ID_BYTES = 200
# The park step's field that carries the wait's concrete keys.
PARK_FIELD = "event_wait"
PUBLISH_TRIES = 3


@dataclass(frozen=True)
class Outgoing:
    """A checked PublishEvent request."""

    workspace_id: str
    name: str
    event_id: str
    body: dict[str, Any]
    published_by: str

    @property
    def canonical(self) -> str:
        return json.dumps(self.body, sort_keys=True, separators=(",", ":"))

    @property
    def digest(self) -> bytes:
        return hashlib.sha256(self.canonical.encode()).digest()


@dataclass(frozen=True)
class Event:
    """One published event, as stored."""

    workspace_id: str
    event_id: str
    name: str
    body: str  # JSON text
    published_by: str
    published_at: datetime
    woke: int
    cancelled: int

    @classmethod
    def of(cls, row: Any) -> Event:
        return cls(
            workspace_id=row["workspace_id"],
            event_id=row["event_id"],
            name=row["name"],
            body=row["body"],
            published_by=row["published_by"],
            published_at=row["published_at"],
            woke=row["woke"],
            cancelled=row["cancelled"],
        )


@dataclass(frozen=True)
class Published:
    event: Event
    # False: the event id was used already; nothing was woken or cancelled again.
    created: bool


async def publish(
    pool: Pool,
    wanted: Outgoing,
    on_runnable: Callable[[], None],
    on_cancel: Callable[[str, uuid.UUID], None],
) -> Published:
    """Store the event, wake the waits it matches and cancel the runs whose version cancels
    on it, in one transaction (tried again on a deadlock with a concurrent publish)."""
    for attempt in range(1, PUBLISH_TRIES + 1):
        try:
            return await _publish_once(pool, wanted, on_runnable, on_cancel)
        except Exception as exc:
            if not deadlock(exc) or attempt == PUBLISH_TRIES:
                raise
    raise AssertionError("unreachable")


async def _publish_once(
    pool: Pool,
    wanted: Outgoing,
    on_runnable: Callable[[], None],
    on_cancel: Callable[[str, uuid.UUID], None],
) -> Published:
    ws, name = wanted.workspace_id, wanted.name
    cancelled: list[run_store.Run] = []
    async with transaction(pool) as conn:
        row = await run(
            conn,
            "event_insert",
            ws,
            wanted.event_id,
            name,
            wanted.canonical,
            wanted.digest,
            wanted.published_by,
        )
        if row is None:
            return _again(await run(conn, "event_get", ws, wanted.event_id), wanted)
        # Cancels first, before the advisory lock: a run parking on this name holds its row
        # lock while it waits for that lock.
        reason = f"cancelled by event {name!r} ({wanted.event_id})"
        for run_id in await _cancel_targets(conn, ws, name, wanted.body):
            if (row := await run_store.cancel_run(conn, ws, run_id, reason)) is not None:
                cancelled.append(row)
        await run(conn, "event_lock_publish", ws, name)
        keys = [
            json.dumps(key)
            for s in await run(conn, "event_shapes_of", ws, name)
            if (key := event_match.project(wanted.body, _json(s["shape"]))) is not None
        ]
        woke = 0
        runnable = False
        if keys:
            for w in await run(conn, "event_waits_matching", ws, name, keys):
                got = await run(
                    conn,
                    "event_deliver",
                    ws,
                    w["run_id"],
                    w["call_seq"],
                    w["slot"],
                    wanted.event_id,
                )
                if got["result_seq"] is not None:
                    woke += 1
                    runnable = True
        await run(conn, "event_counted", ws, wanted.event_id, woke, len(cancelled))
        stored = await run(conn, "event_get", ws, wanted.event_id)
    if runnable:
        on_runnable()
    for row in cancelled:
        on_cancel(ws, row.run_id)
        run_figures.FIGURES.cancelled(row)
    return Published(Event.of(stored), created=True)


def _again(first: Any, wanted: Outgoing) -> Published:
    if first["name"] != wanted.name or bytes(first["body_sha256"]) != wanted.digest:
        raise AlreadyExists(
            f"event_id {wanted.event_id!r} was already published as another event (name "
            f"{first['name']!r}; the name or the body differs); nothing was written"
        )
    return Published(Event.of(first), created=False)


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


async def _cancel_targets(
    conn: Connection, ws: str, name: str, body: dict[str, Any]
) -> list[uuid.UUID]:
    """The unfinished runs whose agent version cancels on this event: for each version that
    declares a cancel_on of this name, its runs whose input holds the values the event's
    body asks for (the run side of the expression)."""
    found: set[uuid.UUID] = set()
    for rule in await run(conn, "event_cancel_rules", ws, name):
        for entry in _json(rule["cancel_on"]) or []:
            if entry.get("event") != name:
                continue
            try:
                match = event_match.parse(str(entry.get("match") or ""))
            except event_match.ExpressionError as exc:  # checked at publish; never stored bad
                log.warning(
                    "agent %s v%s: cancel_on for %r does not parse (%s); skipped",
                    rule["agent_id"],
                    rule["version"],
                    name,
                    exc,
                )
                continue
            wanted = _run_side(match, body)
            if wanted is None:
                continue
            for r in await run(
                conn,
                "event_cancel_targets",
                ws,
                rule["agent_id"],
                rule["version"],
                json.dumps(wanted),
            ):
                found.add(r["run_id"])
    return sorted(found)


def _run_side(match: event_match.Match, body: dict[str, Any]) -> dict[str, Any] | None:
    """What a run's input must contain for this event to match it; None: the event's body
    misses a path or a literal differs, so it matches no run."""
    pairs: list[list[Any]] = []
    for c in match.comparisons:
        key = event_match.project(body, [c.event_path])
        if key is None:
            return None
        value = key[0][1]
        if isinstance(c.other, event_match.Literal):
            if not event_match.same(value, c.other.value):
                return None
        elif c.other.path:
            pairs.append([".".join(c.other.path), value])
        elif not isinstance(value, dict):
            return None  # run.input itself must equal a non-object: no JSON input does
        else:
            for k, v in value.items():
                pairs.append([k, v])
    return event_match.containment(pairs)


# -- the park ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Slot:
    name: str
    key: list[list[Any]]


@dataclass(frozen=True)
class ParkedWait:
    """The wait a park commit declares (its park step's PARK_FIELD)."""

    call_seq: int
    slots: list[Slot]
    lookback_seconds: float


def parked_wait(req: step_store.CommitRequest) -> ParkedWait | None:
    """The wait_for_event call this commit parks on, if it is one."""
    t = req.transition
    if t.status != "waiting" or t.wait_reason != WAIT_REASON:
        return None
    for step in req.steps:
        if step.kind != "park":
            continue
        declared = json.loads(step.payload_json).get(PARK_FIELD)
        if not isinstance(declared, dict):
            continue
        slots = [
            Slot(str(s["name"]), [list(p) for p in s.get("key") or []])
            for s in declared.get("slots") or []
        ]
        return ParkedWait(
            int(declared["call_seq"]), slots, float(declared.get("lookback_seconds") or 0)
        )
    return None


class EventWait:
    """The effect of a park for WAIT_REASON (registered in control_plane/server.py)."""

    async def prepare(self, db: Pool, req: step_store.CommitRequest, msg: pb.Commit) -> Work | None:
        wait = parked_wait(req)
        return None if wait is None else Work(functools.partial(_register, req, wait))


async def _register(req: step_store.CommitRequest, wait: ParkedWait, conn: Connection) -> bool:
    """Index the wait's keys, then deliver what the look-back window already holds: True
    when that ended the wait (the run is runnable again)."""
    ws, rid = req.workspace_id, req.run_id
    for name in sorted({s.name for s in wait.slots}):
        await run(conn, "event_lock_park", ws, name)
    for i, slot in enumerate(wait.slots):
        await run(conn, "event_shape_add", ws, slot.name, json.dumps(event_match.shape(slot.key)))
        await run(
            conn, "event_wait_add", ws, rid, wait.call_seq, i, slot.name, json.dumps(slot.key)
        )
    started = await run(conn, "event_call_started", ws, rid, wait.call_seq)
    if started is None:
        return False
    since = started["created_at"] - timedelta(seconds=wait.lookback_seconds)
    for i, slot in enumerate(wait.slots):
        for event_id in await _earlier(conn, ws, rid, slot, since):
            got = await run(conn, "event_deliver", ws, rid, wait.call_seq, i, event_id)
            if got["result_seq"] is not None:
                return True
            break  # this slot is filled; an `all` call waits on for the others
    return False


async def _earlier(
    conn: Connection, ws: str, rid: uuid.UUID, slot: Slot, since: datetime
) -> list[str]:
    """The events of the slot's name published since `since` that match its key, oldest
    first, which this run has not received."""
    rows = await run(
        conn,
        "event_lookback",
        ws,
        rid,
        slot.name,
        since,
        json.dumps(event_match.containment(slot.key)),
    )
    paths = event_match.shape(slot.key)
    found = []
    for row in rows:
        projected = event_match.project(_json(row["body"]), paths)
        if projected is not None and all(
            event_match.same(a[1], b[1]) for a, b in zip(projected, slot.key, strict=True)
        ):
            found.append(str(row["event_id"]))
    return found
