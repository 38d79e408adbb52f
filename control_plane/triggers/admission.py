"""Turning one trigger event into an event row and, unless filtered, a queued run.

Every source (webhook, schedule, mail, push fetch) ends here. The event and
its run are written by one statement under unique (trigger_id, dedupe_key),
so a redelivery finds the first event and its run, and the reply built from
that row is the same every time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from control_plane.ground.config import RunDefaults
from control_plane.ground.errors import FailedPrecondition
from control_plane.runs import concurrency_keys
from control_plane.store import agents as agent_store
from control_plane.store import flow as flow_store
from control_plane.store import triggers as store
from control_plane.store.admission import MAX_INPUT_BYTES, admission
from control_plane.triggers import mail


@dataclass(frozen=True)
class Event:
    """What a source made of one delivery, before anything is stored."""

    workspace_id: str
    trigger_id: str
    agent_id: str
    kind: str
    dedupe_key: str
    payload: Any
    input_text: str
    # Why filters (or the mail loop stop) refused it; None starts a run.
    filtered: str | None = None
    scheduled_for: datetime | None = None
    chain_depth: int = 0
    # A debounced or batched trigger's event: held pending for its group (triggers/flow.py).
    held: flow_store.PendingEvent | None = None
    # The priority of the run it starts (its trigger's).
    priority: int = 0
    # Its trigger's concurrency_key rule (as stored), overriding the version's; None: none.
    key_rule: dict[str, Any] | None = None
    # What that rule's path reads when not the payload (a schedule's own input).
    key_source: Any = None


@dataclass(frozen=True)
class Outcome:
    """The event as recorded (first delivery or not) and whether this call created it."""

    event_id: str
    status: str
    run_id: str | None
    reason: str | None
    created: bool
    row: Any = None

    def reply(self) -> dict[str, Any]:
        """The HTTP answer: the same for a delivery and all its redeliveries."""
        body: dict[str, Any] = {"event_id": self.event_id, "status": self.status}
        if self.run_id:
            body["run_id"] = self.run_id
        if self.reason:
            body["reason"] = self.reason
        return body

    @classmethod
    def of(cls, row: Any, created: bool) -> Outcome:
        run_id = row["run_id"]
        return cls(
            event_id=str(row["event_id"]),
            status=row["status"],
            run_id=str(run_id) if run_id else None,
            reason=row["reason"],
            created=created,
            row=row,
        )


def clip(text: str, max_bytes: int = MAX_INPUT_BYTES) -> str:
    """`text` cut to fit a run's input limit (at a character boundary)."""
    data = text.encode()
    if len(data) <= max_bytes:
        return text
    note = "\n[truncated]"
    return data[: max_bytes - len(note)].decode(errors="ignore") + note


def key_document(event: Event) -> Any:
    """What a trigger's concurrency_key path is read from: the event as received (a
    webhook's body, a mail's fields), or what its source names instead (a schedule's
    input, read as JSON)."""
    if event.key_source is not None:
        return event.key_source
    return event.payload


def input_payload(event: Event) -> dict[str, Any]:
    """The run's input step: its text and where it came from (docs/protocol.md)."""
    origin: dict[str, Any] = {
        "trigger_id": event.trigger_id,
        "kind": event.kind,
        "dedupe_key": event.dedupe_key,
        "chain_depth": event.chain_depth,
    }
    if event.scheduled_for is not None:
        origin["scheduled_for"] = event.scheduled_for.isoformat()
    if event.kind in ("mail", "mail_push") and isinstance(event.payload, dict):
        origin["mail"] = mail.trigger_fields(event.payload)
    return {"text": clip(event.input_text), "trigger": origin}


async def mail_chain_depth(conn: store.Pool | store.Connection, message: mail.MailMessage) -> int:
    """How many agent hops lie behind an inbound message: its marker's depth, or one more
    than the depth of the run of ours that sent it (found by its key stamp)."""
    run_id = message.sender_run_id
    if run_id is None:
        return message.chain_depth
    # A run that no trigger started (StartRun, a session turn) is a first hop: depth 0.
    return message.depth_after(await store.run_chain_depth(conn, run_id) or 0)


async def admit(
    conn: store.Pool | store.Connection,
    event: Event,
    defaults: RunDefaults,
    now: datetime | None = None,
) -> Outcome:
    """Record the event (and its run, unless filtered; pending, when its trigger debounces
    or batches) once per dedupe key."""
    version = await agent_store.get_version(conn, event.workspace_id, event.agent_id, 0)
    if version is None:
        raise FailedPrecondition(f"agent {event.agent_id!r} has no published version")
    if event.held is not None and event.filtered is None:
        row = await flow_store.hold(conn, event.held, now)
        return await _outcome(conn, event, row)
    payload = input_payload(event)
    adm = store.EventAdmission(
        workspace_id=event.workspace_id,
        trigger_id=event.trigger_id,
        dedupe_key=event.dedupe_key,
        payload=event.payload,
        reason=event.filtered,
        # Started by the trigger, not a person: four eyes excludes nobody for it.
        run=admission(
            version,
            defaults,
            payload["text"],
            input_payload=payload,
            started_by=f"trigger:{event.trigger_id}",
            priority=event.priority,
            key_rule=concurrency_keys.trigger_rule(event.key_rule, key_document(event)),
        ),
        scheduled_for=event.scheduled_for,
        chain_depth=event.chain_depth,
    )
    return await _outcome(conn, event, await store.admit_event(conn, adm, now))


async def _outcome(conn: store.Pool | store.Connection, event: Event, row: Any) -> Outcome:
    """This call's new event, or the first event of its dedupe key (a redelivery)."""
    if row is not None:
        return Outcome.of(row, created=True)
    existing = await store.event_by_key(
        conn, event.workspace_id, event.trigger_id, event.dedupe_key
    )
    assert existing is not None, "the dedupe constraint fired, so the first event exists"
    return Outcome.of(existing, created=False)
