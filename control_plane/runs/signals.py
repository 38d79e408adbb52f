"""Signals: a named event sent to a run (RunService.SignalRun), the result of its
`wait_for_signal` call exactly once.

A run's signals are a mailbox (table run_signals). SignalRun stores the signal under the
run row's lock and, when the run waits on a signal of that name, writes it as the open
call's tool_result and wakes the run. The executor parks a wait_for_signal call as wait
reason "signal" (tool_started and park in one commit); here (SignalWait, an effect of the
commit pipeline: dispatch/pipeline.py), in that commit's transaction,
a signal that arrived before the park (or while its commit was in flight) is delivered the
same way. migrations/0016_signals.sql argues why each signal answers at most one call and
each call at most one signal.

Idempotent by event id, per run: a second SignalRun with the same event id, name and
payload is a no-op answered with the first's signal (created = false), even after the run
ended; the same event id with another name or payload is ALREADY_EXISTS and nothing is
written. A signal to a run that ended is FAILED_PRECONDITION.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import faults
from agentrun.v1 import executor_pb2 as pb
from control_plane.dispatch.pipeline import Work
from control_plane.ground.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from control_plane.store import steps as step_store
from control_plane.store.db import Connection, Pool, transaction
from control_plane.store.queries import run

TOOL = "wait_for_signal"
WAIT_REASON = "signal"
TERMINAL = frozenset({"completed", "failed", "cancelled"})
MAX_PAYLOAD_BYTES = 256 * 1024
MAX_EVENT_ID_BYTES = 200
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z")  # \Z: `$` would also take "name\n"


@dataclass(frozen=True)
class Signal:
    """One signal of a run, as stored."""

    workspace_id: str
    run_id: uuid.UUID
    event_id: str
    name: str
    payload: str  # JSON text
    sent_by: str
    created_at: datetime
    # The wait_for_signal call it answered and its tool_result's seq (None: still pending).
    consumed_seq: int | None
    result_seq: int | None
    consumed_at: datetime | None

    @classmethod
    def of(cls, row: Any) -> Signal:
        return cls(
            workspace_id=row["workspace_id"],
            run_id=row["run_id"],
            event_id=row["event_id"],
            name=row["name"],
            payload=row["payload"],
            sent_by=row["sent_by"],
            created_at=row["created_at"],
            consumed_seq=row["consumed_seq"],
            result_seq=row["result_seq"],
            consumed_at=row["consumed_at"],
        )


@dataclass(frozen=True)
class Sent:
    signal: Signal
    # False: the event id was used already and this is the first signal, unchanged.
    created: bool


@dataclass(frozen=True)
class Outgoing:
    """A checked SignalRun request."""

    workspace_id: str
    run_id: uuid.UUID
    name: str
    event_id: str
    payload: Any  # the parsed JSON value
    sent_by: str

    @property
    def canonical(self) -> str:
        return json.dumps(self.payload, sort_keys=True, separators=(",", ":"))

    @property
    def digest(self) -> bytes:
        return hashlib.sha256(self.canonical.encode()).digest()


def check_name(field: str, value: str) -> str:
    if not value:
        raise InvalidArgument(field, "is required")
    if not NAME.match(value):
        raise InvalidArgument(
            field, "must be 1-128 letters, digits, '.', '_', ':' or '-', starting alphanumeric"
        )
    return value


def same_signal(stored: Any, wanted: Outgoing) -> bool:
    """Whether a stored signal row is the one this request sends again: the same name and
    the same payload as a JSON value (the SHA-256 of its canonical text)."""
    return stored["name"] == wanted.name and bytes(stored["payload_sha256"]) == wanted.digest


async def send(pool: Pool | Connection, wanted: Outgoing, on_runnable: Callable[[], None]) -> Sent:
    """Store the signal and deliver it if the run waits for it, under the run row's lock."""
    ws, rid = wanted.workspace_id, wanted.run_id
    async with transaction(pool) as conn:
        locked = await run(conn, "signal_lock_run", ws, rid)
        if locked is None:
            raise NotFound(f"run {rid} not found")
        if (first := await run(conn, "signal_get", ws, rid, wanted.event_id)) is not None:
            return _again(first, wanted)
        if locked["status"] in TERMINAL:
            raise FailedPrecondition(f"run {rid} already ended ({locked['status']})")
        await run(
            conn,
            "signal_insert",
            ws,
            rid,
            wanted.event_id,
            wanted.name,
            wanted.canonical,
            wanted.digest,
            wanted.sent_by,
        )
        delivered = await run(conn, "signal_deliver", ws, rid)
        row = await run(conn, "signal_get", ws, rid, wanted.event_id)
        faults.point("control_plane.signal.before_commit")
    faults.point("control_plane.signal.after_commit")
    if delivered["result_seq"] is not None:
        on_runnable()
    return Sent(Signal.of(row), created=True)


def _again(first: Any, wanted: Outgoing) -> Sent:
    if not same_signal(first, wanted):
        raise AlreadyExists(
            f"event_id {wanted.event_id!r} was already sent to run {wanted.run_id} as another "
            f"signal (name {first['name']!r}; the name or the payload differs); nothing was "
            "written"
        )
    return Sent(Signal.of(first), created=False)


class SignalWait:
    """The effect of a park for WAIT_REASON (registered in control_plane/server.py)."""

    async def prepare(self, db: Pool, req: step_store.CommitRequest, msg: pb.Commit) -> Work:
        """Deliver, in the park's transaction, a signal that is already there."""
        return Work(functools.partial(_deliver_waiting, req))


async def _deliver_waiting(req: step_store.CommitRequest, conn: Connection) -> bool:
    delivered = await run(conn, "signal_deliver", req.workspace_id, req.run_id)
    return bool(delivered["result_seq"] is not None)


async def signals_of(pool: Pool, workspace_id: str, run_id: uuid.UUID) -> list[Signal]:
    """A run's signals, in order of arrival."""
    return [Signal.of(r) for r in await run(pool, "signals_of_run", workspace_id, run_id)]
