"""Inbound mail as trigger events: the message shape, its Message-ID, and the loop stop.

A mail provider delivers each inbound message as JSON:

    {"message_id": "<abc@mail.example>", "from": "Ada <ada@example.com>",
     "to": ["triage@acme.test"], "cc": [], "subject": "…", "text": "…",
     "headers": {"X-Agentrun-Origin": "agentrun", "X-Agentrun-Chain-Depth": "2"}}

The Message-ID is the dedupe key: the same message delivered twice, or
fetched by two overlapping fetches, starts one run.

Agent-to-agent loops: mail our agents send carries a marker header and a
chain depth (`outbound_headers`; the executor stamps them on every send,
executor/tools/chain.py): one more than the depth of the run that sent it,
which the run's input step records as `trigger.chain_depth`. The marker is
read from the message alone, so mail from another installation (or from a
run this database no longer has) stops just the same. The
executor's mail tool also stamps every send with `X-Agentrun-Key:
<run_id>:<seq>` (its lookup key, executor/tools/catalogue.json), which marks
the mail as ours on its own: its depth is one more than the sending run's,
which the control plane looks up. Inbound mail whose depth passes the
trigger's `max_chain_depth` starts no run; its event is recorded as filtered,
with the reason.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from email.utils import parseaddr
from typing import Any

from control_plane.ground import validate

MARKER_HEADER = "X-Agentrun-Origin"
MARKER_VALUE = "agentrun"
DEPTH_HEADER = "X-Agentrun-Chain-Depth"
# The idempotency key our mail tool stamps on every send: "<run_id>:<seq>".
KEY_HEADER = "X-Agentrun-Key"
DEFAULT_MAX_CHAIN_DEPTH = 3
MAX_CHAIN_DEPTH = 20
MAX_MESSAGE_ID_BYTES = 500


class BadMessage(ValueError):
    """A delivered message that is not one (names the field)."""


def outbound_headers(run_chain_depth: int) -> dict[str, str]:
    """The headers mail sent by a run at `run_chain_depth` must carry."""
    return {MARKER_HEADER: MARKER_VALUE, DEPTH_HEADER: str(run_chain_depth + 1)}


@dataclass(frozen=True)
class MailMessage:
    message_id: str
    sender: str
    to: tuple[str, ...]
    subject: str
    text: str
    cc: tuple[str, ...] = ()
    headers: Mapping[str, str] = field(default_factory=dict)
    # The provider's thread id ("" = the message starts its own thread) and the ids
    # of its attachments: argument constraints read them from the run's input step.
    thread_id: str = ""
    attachments: tuple[str, ...] = ()

    @property
    def sender_address(self) -> str:
        return parseaddr(self.sender)[1].lower()

    @property
    def chain_depth(self) -> int:
        """Agent hops behind this message: 0 unless it carries our marker."""
        if self.headers.get(MARKER_HEADER.lower(), "").strip().lower() != MARKER_VALUE:
            return 0
        raw = self.headers.get(DEPTH_HEADER.lower(), "1").strip()
        # A marked message with an unreadable depth is treated as deep: it stops.
        return int(raw) if raw.isdigit() and len(raw) < 4 else MAX_CHAIN_DEPTH + 1

    @property
    def sender_run_id(self) -> uuid.UUID | None:
        """The run that sent this message, when it carries our mail tool's key stamp."""
        run_id, _, seq = self.headers.get(KEY_HEADER.lower(), "").strip().rpartition(":")
        try:
            return uuid.UUID(run_id) if seq.isdigit() else None
        except ValueError:
            return None

    def depth_after(self, sender_depth: int) -> int:
        """The chain depth of a message one of our runs (at `sender_depth`) sent."""
        return max(self.chain_depth, min(sender_depth, MAX_CHAIN_DEPTH) + 1)

    def document(self) -> dict[str, Any]:
        """The event document filters look at and the event records."""
        return {
            "message_id": self.message_id,
            "from": self.sender,
            "from_address": self.sender_address,
            "to": list(self.to),
            "cc": list(self.cc),
            "subject": self.subject,
            "text": self.text,
            "headers": dict(self.headers),
            "thread_id": self.thread_id or self.message_id,
            "attachments": list(self.attachments),
        }

    def render_input(self) -> str:
        """The run's input: the message as the agent reads it."""
        lines = [
            "New email",
            f"From: {self.sender}",
            f"To: {', '.join(self.to)}",
        ]
        if self.cc:
            lines.append(f"Cc: {', '.join(self.cc)}")
        lines += [f"Subject: {self.subject}", f"Message-ID: {self.message_id}", "", self.text]
        return "\n".join(lines)


def loop_reason(depth: int, max_depth: int) -> str | None:
    """Why a message at `depth` starts no run, or None."""
    if depth > max_depth:
        return f"agent-to-agent loop stopped: chain depth {depth} exceeds {max_depth}"
    return None


def _text(doc: Mapping[str, Any], name: str, *, required: bool = False) -> str:
    value = doc.get(name, "")
    if not isinstance(value, str):
        raise BadMessage(f"{name}: must be a string")
    if required and not value.strip():
        raise BadMessage(f"{name}: is required")
    return _storable(name, value)


def _storable(name: str, value: str) -> str:
    """`value`, if text Postgres can store (validate.unstorable). Else the message is
    refused naming the field: a mail push source skips it instead of failing on it at
    every fetch."""
    if problem := validate.unstorable(value):
        raise BadMessage(f"{name}: {problem}")
    return value


def _addresses(doc: Mapping[str, Any], name: str) -> tuple[str, ...]:
    value = doc.get(name, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadMessage(f"{name}: must be a list of addresses")
    for address in value:
        _storable(name, address)
    return tuple(value)


def _headers(doc: Mapping[str, Any]) -> dict[str, str]:
    value = doc.get("headers", {})
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise BadMessage("headers: must be an object of strings")
    return {_storable("headers", k).lower(): _storable("headers", v) for k, v in value.items()}


def parse_message(doc: Any) -> MailMessage:
    """A delivered message; raises BadMessage naming the field that is wrong."""
    if not isinstance(doc, Mapping):
        raise BadMessage("body: must be a JSON object (one mail message)")
    message_id = _text(doc, "message_id", required=True).strip()
    if len(message_id.encode()) > MAX_MESSAGE_ID_BYTES:
        raise BadMessage(f"message_id: is longer than {MAX_MESSAGE_ID_BYTES} bytes")
    return MailMessage(
        message_id=message_id,
        sender=_text(doc, "from", required=True),
        to=_addresses(doc, "to"),
        cc=_addresses(doc, "cc"),
        subject=_text(doc, "subject"),
        text=_text(doc, "text"),
        headers=_headers(doc),
        thread_id=_text(doc, "thread_id").strip(),
        attachments=_attachments(doc),
    )


def _attachments(doc: Mapping[str, Any]) -> tuple[str, ...]:
    """Attachment ids: a list of ids, or of objects with an `id`."""
    value = doc.get("attachments", [])
    ids = (
        [a.get("id") if isinstance(a, Mapping) else a for a in value]
        if isinstance(value, list)
        else None
    )
    if ids is None or not all(isinstance(i, str) and i for i in ids):
        raise BadMessage("attachments: must be a list of ids (or of objects with an id)")
    return tuple(_storable("attachments", i) for i in ids)  # type: ignore[arg-type]


def trigger_fields(document: Mapping[str, Any]) -> dict[str, Any]:
    """What a run's input step records of the mail that started it (docs/protocol.md)."""
    return {
        "message_id": document.get("message_id", ""),
        "thread_id": document.get("thread_id") or document.get("message_id", ""),
        "from": document.get("from_address") or document.get("from", ""),
        "to": list(document.get("to") or []),
        "cc": list(document.get("cc") or []),
        "subject": document.get("subject", ""),
        "attachments": list(document.get("attachments") or []),
    }
