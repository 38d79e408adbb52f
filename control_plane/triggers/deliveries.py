"""From a verified HTTP delivery to an Event: body parsing, dedupe keys, filters, mail rules.

Nothing here touches the network or the database; the ingress calls these
after the signature checked out and before `admission.admit`.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from control_plane.ground import validate
from control_plane.ground.errors import InvalidArgument
from control_plane.triggers import filters, flow, mail
from control_plane.triggers.admission import Event
from control_plane.triggers.signatures import SCHEMES

MAX_DEDUPE_KEY_BYTES = 500


class BadDelivery(ValueError):
    """A signed delivery whose body or headers cannot be used (HTTP 400, names what)."""


@dataclass(frozen=True)
class Settings:
    """A trigger row's kind-specific settings, decoded once."""

    workspace_id: str
    trigger_id: str
    agent_id: str
    kind: str
    scheme: str | None
    config: Mapping[str, Any]
    rules: tuple[filters.Rule, ...]

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Settings:
        config = row["config"]
        rules = row["filters"]
        return cls(
            workspace_id=row["workspace_id"],
            trigger_id=row["trigger_id"],
            agent_id=row["agent_id"],
            kind=row["kind"],
            scheme=row["scheme"],
            config=json.loads(config) if isinstance(config, str) else config,
            rules=tuple(
                filters.Rule.from_json(r)
                for r in (json.loads(rules) if isinstance(rules, str) else rules)
            ),
        )

    @property
    def tolerance(self) -> int | None:
        """The replay window in seconds, or None when the scheme signs no timestamp."""
        if self.config.get("untimed"):
            return None
        assert self.scheme is not None
        return self.config.get("tolerance_seconds") or SCHEMES[self.scheme].default_tolerance

    @property
    def priority(self) -> int:
        """The priority of the runs it starts (CreateTrigger's, kept in the config)."""
        return int(self.config.get("priority", 0))

    @property
    def key_rule(self) -> dict[str, Any] | None:
        """The concurrency_key rule of the runs it starts (CreateTrigger's, in the config;
        None: their version's)."""
        rule = self.config.get("concurrency_key")
        return dict(rule) if rule else None

    @property
    def publish_event(self) -> str:
        """The event name its deliveries are published as ('' : it starts runs)."""
        return str(self.config.get("publish_event") or "")

    @property
    def max_chain_depth(self) -> int:
        return int(self.config.get("max_chain_depth") or mail.DEFAULT_MAX_CHAIN_DEPTH)

    def event(self, **fields: Any) -> Event:
        return Event(
            workspace_id=self.workspace_id,
            trigger_id=self.trigger_id,
            agent_id=self.agent_id,
            kind=self.kind,
            priority=self.priority,
            key_rule=self.key_rule,
            **fields,
        )


def parse_body(raw: bytes, content_type: str) -> Any:
    """The body as a document: JSON, or a form (Slack commands and interactivity)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadDelivery("body: is not UTF-8") from None
    if content_type.split(";")[0].strip().lower() == "application/x-www-form-urlencoded":
        doc: dict[str, Any] = dict(parse_qsl(text, keep_blank_values=True))
        if any("\x00" in k or "\x00" in v for k, v in doc.items()):
            raise BadDelivery("body: contains a NUL character")
        if "payload" in doc:  # Slack interactivity posts its JSON as a form field
            doc["payload"] = _json(doc["payload"], "body.payload")
        return doc
    return _json(text, "body")


def _json(text: str, name: str) -> Any:
    try:
        return validate.json_value(name, text, max_bytes=len(text))
    except InvalidArgument as exc:
        raise BadDelivery(str(exc)) from None


def dedupe_key(settings: Settings, headers: Mapping[str, str], doc: Any) -> str:
    """The delivery's stable id: the trigger's named source, else the scheme's."""
    assert settings.scheme is not None
    scheme = SCHEMES[settings.scheme]
    header = settings.config.get("dedupe_header")
    field = settings.config.get("dedupe_field")
    header_names: tuple[str, ...]
    field_names: tuple[str, ...]
    if header or field:
        header_names = (header.lower(),) if header else ()
        field_names = (field,) if field else ()
    else:
        header_names, field_names = scheme.dedupe_headers, scheme.dedupe_fields
    for name in header_names:
        if value := headers.get(name, "").strip():
            return _checked_key(value)
    for path in field_names:
        value = filters.lookup(doc, path)
        if isinstance(value, str | int) and not isinstance(value, bool) and str(value).strip():
            return _checked_key(str(value).strip())
    wanted = [f"header {h}" for h in header_names] + [f"body field {f}" for f in field_names]
    raise BadDelivery(f"no delivery id: expected {' or '.join(wanted)}")


def _checked_key(key: str) -> str:
    if len(key.encode()) > MAX_DEDUPE_KEY_BYTES:
        raise BadDelivery(f"the delivery id is longer than {MAX_DEDUPE_KEY_BYTES} bytes")
    return key


def webhook_event(settings: Settings, headers: Mapping[str, str], doc: Any) -> Event:
    """A webhook delivery as an event: deduped on its delivery id, filtered by the rules."""
    key = dedupe_key(settings, headers, doc)
    text = flow.webhook_text(settings.trigger_id, settings.scheme, key, doc)
    held = flow.pending(
        settings.config, settings.workspace_id, settings.trigger_id, key, headers, doc
    )
    return settings.event(
        dedupe_key=key,
        payload=doc,
        input_text=text,
        filtered=filters.first_failure(settings.rules, doc),
        held=held,
    )


def mail_event(settings: Settings, message: mail.MailMessage, depth: int = 0) -> Event:
    """An inbound message as an event: deduped on its Message-ID; loops and filters stop it.

    `depth` is the message's chain depth (`admission.mail_chain_depth`)."""
    document = message.document()
    reason = mail.loop_reason(depth, settings.max_chain_depth) or filters.first_failure(
        settings.rules, document
    )
    return settings.event(
        dedupe_key=message.message_id,
        payload=document,
        input_text=message.render_input(),
        filtered=reason,
        chain_depth=min(depth, mail.MAX_CHAIN_DEPTH + 1),
    )


def parse_mail(doc: Any) -> mail.MailMessage:
    try:
        return mail.parse_message(doc)
    except mail.BadMessage as exc:
        raise BadDelivery(str(exc)) from None


def push_history_id(doc: Any) -> int:
    """The history id of a push notification: Pub/Sub's envelope or the bare object.

    Gmail's push is `{"message": {"data": base64(JSON {"emailAddress", "historyId"}), …}}`.
    """
    if isinstance(doc, Mapping) and isinstance(doc.get("message"), Mapping):
        data = doc["message"].get("data")
        if not isinstance(data, str):
            raise BadDelivery("message.data: must be base64 JSON")
        try:
            doc = validate.json_value("message.data", base64.b64decode(data, validate=True))
        except (binascii.Error, ValueError, InvalidArgument):
            raise BadDelivery("message.data: must be base64 JSON") from None
    history = doc.get("historyId") if isinstance(doc, Mapping) else None
    if isinstance(history, str) and history.isdigit():
        history = int(history)
    if not isinstance(history, int) or isinstance(history, bool) or not 0 <= history < 2**63:
        raise BadDelivery("historyId: must be a non-negative integer")
    return history
