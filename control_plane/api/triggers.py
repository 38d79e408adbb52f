"""TriggerService: parse and validate, call the store, convert. Nothing else."""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import grpc

from agentrun.v1 import trigger_pb2 as pb
from agentrun.v1 import trigger_pb2_grpc
from control_plane.api.agents import validate_key_rule
from control_plane.api.runs import decode_page_token, encode_page_token
from control_plane.api.schedules import (
    MAX_NOTE_BYTES,
    ScheduleRpcs,
    parse_schedule,
    schedule_source,
)
from control_plane.api.trigger_events import event_message
from control_plane.auth import audit
from control_plane.auth import context as auth_context
from control_plane.crypto.envelope import Envelope
from control_plane.ground import convert, validate
from control_plane.ground.config import RunDefaults
from control_plane.ground.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from control_plane.runs import signals
from control_plane.store import agents as agent_store
from control_plane.store import connections as connection_store
from control_plane.store import triggers as store
from control_plane.store.db import transaction
from control_plane.triggers import filters, flow, mail, schedule_ops, sealed_secrets, signatures

SCHEME_NAMES = {
    pb.SIGNATURE_SCHEME_HMAC_SHA256: "hmac_sha256",
    pb.SIGNATURE_SCHEME_STRIPE: "stripe",
    pb.SIGNATURE_SCHEME_SLACK: "slack",
    pb.SIGNATURE_SCHEME_GITHUB: "github",
    pb.SIGNATURE_SCHEME_STANDARD_WEBHOOKS: "standard_webhooks",
}
SCHEME_VALUES = {name: value for value, name in SCHEME_NAMES.items()}
OP_NAMES = {
    value: pb.FilterOp.Name(value).removeprefix("FILTER_OP_").lower()
    for value in pb.FilterOp.values()
    if value
}
OP_VALUES = {name: value for value, name in OP_NAMES.items()}
HTTP_KINDS = ("webhook", "mail", "mail_push")
DEFAULT_GRACE_SECONDS = 24 * 3600
MAX_GRACE_SECONDS = 30 * 24 * 3600
MAX_TOLERANCE_SECONDS = 24 * 3600
_HEADER_NAME = re.compile(r"^[A-Za-z0-9-]{1,100}$")


def _seconds(duration: Any) -> float:
    return duration.ToTimedelta().total_seconds()


def _scheme(field: str, value: int, *, default: str | None = None) -> str:
    if value == pb.SIGNATURE_SCHEME_UNSPECIFIED and default:
        return default
    if value not in SCHEME_NAMES:
        raise InvalidArgument(field, f"must be one of {', '.join(SCHEME_VALUES)}")
    return SCHEME_NAMES[value]


def parse_filters(rules: Any) -> list[dict[str, Any]]:
    if len(rules) > filters.MAX_RULES:
        raise InvalidArgument(
            "filters", f"has {len(rules)} rules; the limit is {filters.MAX_RULES}"
        )
    out = []
    for i, r in enumerate(rules):
        rule = filters.Rule(
            r.field, OP_NAMES.get(r.op, "?"), r.value, tuple(r.values), r.ignore_case
        )
        if problem := filters.check(rule):
            raise InvalidArgument(f"filters[{i}]", problem)
        out.append(rule.to_json())
    return out


def _webhook(src: pb.WebhookSource) -> tuple[str, dict[str, Any]]:
    scheme = _scheme("webhook.scheme", src.scheme)
    config: dict[str, Any] = {}
    if src.HasField("tolerance"):
        seconds = _seconds(src.tolerance)
        if not 1 <= seconds <= MAX_TOLERANCE_SECONDS or seconds != int(seconds):
            raise InvalidArgument(
                "webhook.tolerance", f"must be whole seconds from 1 to {MAX_TOLERANCE_SECONDS}"
            )
        config["tolerance_seconds"] = int(seconds)
    if src.untimed:
        if scheme != "hmac_sha256":
            raise InvalidArgument("webhook.untimed", "only hmac_sha256 deliveries can be untimed")
        config["untimed"] = True
    if src.dedupe_header:
        if not _HEADER_NAME.match(src.dedupe_header):
            raise InvalidArgument("webhook.dedupe_header", "is not a header name")
        config["dedupe_header"] = src.dedupe_header
    if src.dedupe_field:
        validate.text("webhook.dedupe_field", src.dedupe_field, max_bytes=200)
        config["dedupe_field"] = src.dedupe_field
    config |= flow.config("webhook", src.debounce, src.batch)
    return scheme, config


def _chain_depth(field: str, value: int) -> int:
    return validate.in_range(field, value or mail.DEFAULT_MAX_CHAIN_DEPTH, 1, mail.MAX_CHAIN_DEPTH)


def _mail(src: pb.MailSource) -> tuple[str, dict[str, Any]]:
    return _scheme("mail.scheme", src.scheme, default="hmac_sha256"), {
        "address": validate.text("mail.address", src.address, max_bytes=320),
        "max_chain_depth": _chain_depth("mail.max_chain_depth", src.max_chain_depth),
    }


def _mail_push(src: pb.MailPushSource) -> tuple[str, dict[str, Any]]:
    url = validate.text("mail_push.history_url", src.history_url, max_bytes=2000, required=True)
    if not re.match(r"^https?://[^\s/]+(/\S*)?$", url):
        raise InvalidArgument("mail_push.history_url", "must be an http(s) URL")
    validate.non_negative("mail_push.start_history_id", src.start_history_id)
    config: dict[str, Any] = {
        "history_url": url,
        "max_chain_depth": _chain_depth("mail_push.max_chain_depth", src.max_chain_depth),
    }
    if src.connection_id:
        try:
            config["connection_id"] = str(uuid.UUID(src.connection_id))
        except ValueError:
            raise InvalidArgument("mail_push.connection_id", "is not a connection id") from None
    return _scheme("mail_push.scheme", src.scheme, default="hmac_sha256"), config


def new_trigger(request: pb.CreateTriggerRequest, now: datetime) -> store.NewTrigger:
    """The validated trigger a CreateTrigger request describes; the priority of the runs it
    starts rides in its config (0, the default, is left out), and so does their
    concurrency_key rule (stored as an agent version's spec keeps it)."""
    priority = validate.priority("priority", request.priority)
    new = _new_trigger(request, now)
    if request.publish_event:
        new = dataclasses.replace(new, config={**new.config, **_publishes(request, new)})
    if request.HasField("concurrency_key"):
        validate_key_rule("concurrency_key", request.concurrency_key)
        if request.publish_event:
            raise InvalidArgument(
                "concurrency_key", "a trigger that publishes events starts no runs to key"
            )
        rule = convert.concurrency_key_to_json(request.concurrency_key)
        new = dataclasses.replace(new, config={**new.config, "concurrency_key": rule})
    if not priority:
        return new
    return dataclasses.replace(new, config={**new.config, "priority": priority})


def _publishes(request: pb.CreateTriggerRequest, new: store.NewTrigger) -> dict[str, Any]:
    """A webhook trigger that publishes its deliveries as events (issue 45)."""
    name = signals.check_name("publish_event", request.publish_event)
    if new.kind != "webhook":
        raise InvalidArgument("publish_event", "only a webhook trigger publishes events")
    if "debounce" in new.config or "batch" in new.config:
        raise InvalidArgument(
            "publish_event",
            "a trigger that publishes events neither "
            "debounces nor batches (each delivery is one event)",
        )
    return {"publish_event": name}


def _new_trigger(request: pb.CreateTriggerRequest, now: datetime) -> store.NewTrigger:
    ws = auth_context.workspace(request.workspace_id)
    trigger_id = validate.slug("trigger_id", request.trigger_id)
    agent_id = validate.slug("agent_id", request.agent_id)
    rules = parse_filters(request.filters)
    kind = request.WhichOneof("source")
    base: dict[str, Any] = {
        "workspace_id": ws,
        "trigger_id": trigger_id,
        "agent_id": agent_id,
        "filters": rules,
    }
    if kind == "schedule":
        return _schedule_trigger(request.schedule, base, now)
    if kind == "webhook":
        scheme, config = _webhook(request.webhook)
    elif kind == "mail":
        scheme, config = _mail(request.mail)
    elif kind == "mail_push":
        scheme, config = _mail_push(request.mail_push)
        start = request.mail_push.start_history_id
        return store.NewTrigger(
            **base, kind=kind, scheme=scheme, config=config, last_history_id=start
        )
    else:
        raise InvalidArgument("source", "set one of webhook, schedule, mail, mail_push")
    return store.NewTrigger(**base, kind=kind, scheme=scheme, config=config)


def _schedule_trigger(
    src: pb.ScheduleSource, base: dict[str, Any], now: datetime
) -> store.NewTrigger:
    if base["filters"]:
        raise InvalidArgument("filters", "schedules have no event to filter")
    sched, text = parse_schedule(src, now)
    slot = sched.next_slot_after(now)
    return store.NewTrigger(
        **base,
        kind="schedule",
        scheme=None,
        config={**sched.to_json(), "input": text},
        next_slot_at=slot,
        next_fire_at=sched.fire_time(slot, base["workspace_id"], base["trigger_id"]),
    )


def _secret(field: str, scheme: str, given: str) -> str:
    if not given:
        return signatures.generate_secret(scheme)
    try:
        signatures.check_secret(scheme, given)
    except ValueError as exc:
        raise InvalidArgument(field, str(exc)) from None
    return given


# --- rows to messages -------------------------------------------------------------------------


def _rule_message(data: dict[str, Any]) -> pb.FilterRule:
    rule = filters.Rule.from_json(data)
    return pb.FilterRule(
        field=rule.field,
        op=OP_VALUES[rule.op],
        value=rule.value,
        values=list(rule.values),
        ignore_case=rule.ignore_case,
    )


def _source(msg: pb.Trigger, row: Any, config: dict[str, Any]) -> None:
    kind, scheme = row["kind"], SCHEME_VALUES.get(row["scheme"] or "", 0)
    if kind == "webhook":
        msg.webhook.scheme = scheme
        msg.webhook.untimed = bool(config.get("untimed"))
        msg.webhook.dedupe_header = config.get("dedupe_header", "")
        msg.webhook.dedupe_field = config.get("dedupe_field", "")
        if deb := config.get("debounce"):
            msg.webhook.debounce.CopyFrom(pb.TriggerDebounce(**deb))
        if bat := config.get("batch"):
            msg.webhook.batch.CopyFrom(pb.TriggerBatch(**bat))
        if "tolerance_seconds" in config:
            msg.webhook.tolerance.CopyFrom(convert.duration(config["tolerance_seconds"]))
    elif kind == "mail":
        msg.mail.CopyFrom(
            pb.MailSource(
                address=config.get("address", ""),
                max_chain_depth=config["max_chain_depth"],
                scheme=scheme,
            )
        )
    elif kind == "mail_push":
        msg.mail_push.CopyFrom(
            pb.MailPushSource(
                history_url=config["history_url"],
                max_chain_depth=config["max_chain_depth"],
                scheme=scheme,
                last_history_id=row["last_history_id"] or 0,
                announced_history_id=row["announced_history_id"] or 0,
                connection_id=config.get("connection_id", ""),
                fetch_error=row.get("fetch_error") or "",
            )
        )
    else:
        schedule_source(msg.schedule, row, config)


def trigger_message(row: Any, secrets: list[Any], public_url: str) -> pb.Trigger:
    config = json.loads(row["config"])
    msg = pb.Trigger(
        workspace_id=row["workspace_id"],
        trigger_id=row["trigger_id"],
        agent_id=row["agent_id"],
        enabled=row["enabled"],
        filters=[_rule_message(r) for r in json.loads(row["filters"])],
        note=row["note"] or "",
        priority=config.get("priority", 0),
        publish_event=config.get("publish_event", ""),
    )
    key = convert.concurrency_key_from_json(config.get("concurrency_key"))
    if key is not None:
        msg.concurrency_key.CopyFrom(key)
    _source(msg, row, config)
    if row["kind"] in HTTP_KINDS:
        msg.url = f"{public_url}/hooks/{row['workspace_id']}/{row['trigger_id']}"
    for s in secrets:
        info = pb.TriggerSecret(secret_id=s["secret_id"])
        info.create_time.CopyFrom(convert.timestamp(s["created_at"]))
        if s["expires_at"] is not None:
            info.expire_time.CopyFrom(convert.timestamp(s["expires_at"]))
        msg.secrets.append(info)
    msg.create_time.CopyFrom(convert.timestamp(row["created_at"]))
    msg.update_time.CopyFrom(convert.timestamp(row["updated_at"]))
    return msg


def _id_token(trigger_id: str) -> str:
    return base64.urlsafe_b64encode(trigger_id.encode()).decode()


def _id_from_token(token: str) -> str | None:
    if not token:
        return None
    try:
        return validate.slug("page_token", base64.urlsafe_b64decode(token.encode()).decode())
    except (ValueError, InvalidArgument):
        raise InvalidArgument("page_token", "is not a token this service issued") from None


class TriggerServicer(ScheduleRpcs, trigger_pb2_grpc.TriggerServiceServicer):
    def __init__(
        self,
        pool: store.Pool,
        public_url: str,
        envelope: Envelope,
        defaults: RunDefaults | None = None,
        on_runnable: Callable[[], None] = lambda: None,
        on_cancel: Callable[[str, uuid.UUID], None] | None = None,
    ) -> None:
        self._pool = pool
        self._public_url = public_url
        self._envelope = envelope  # seals signing secrets before they are stored
        # Backfill and trigger-now admit runs: the server's run defaults and its hooks.
        self._defaults = defaults or RunDefaults()
        self._on_runnable = on_runnable
        self._on_cancel = on_cancel

    async def _message(self, row: Any) -> pb.Trigger:
        secrets = await store.active_secrets(self._pool, row["workspace_id"], row["trigger_id"])
        return trigger_message(row, secrets, self._public_url)

    async def _get(self, ws: str, trigger_id: str) -> Any:
        row = await store.get_trigger(self._pool, ws, trigger_id)
        if row is None:
            raise NotFound(f"trigger {trigger_id!r} not found")
        return row

    async def _check_agent(self, ws: str, agent_id: str) -> None:
        if await agent_store.get_agent(self._pool, ws, agent_id) is None:
            raise NotFound(f"agent {agent_id!r} not found")
        if await agent_store.get_version(self._pool, ws, agent_id, 0) is None:
            raise FailedPrecondition(f"agent {agent_id!r} has no published version yet")

    async def _check_connection(self, ws: str, connection_id: str | None) -> None:
        if connection_id and await connection_store.get(self._pool, ws, connection_id) is None:
            raise InvalidArgument(
                "mail_push.connection_id", f"no connection {connection_id} in this workspace"
            )

    async def CreateTrigger(
        self, request: pb.CreateTriggerRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateTriggerResponse:
        new = new_trigger(request, datetime.now(UTC))
        secret = (
            None if new.kind == "schedule" else _secret("secret", new.scheme or "", request.secret)
        )
        if new.kind == "schedule" and request.secret:
            raise InvalidArgument(
                "secret", "schedules are not called by anyone; they have no secret"
            )
        await self._check_agent(new.workspace_id, new.agent_id)
        await self._check_connection(new.workspace_id, new.config.get("connection_id"))
        async with store.transaction(self._pool) as conn:
            row = await sealed_secrets.create(conn, self._envelope, new, secret)
            if row is not None:
                await audit.record(
                    conn,
                    "trigger.created",
                    "trigger",
                    new.trigger_id,
                    {"kind": new.kind, "agent_id": new.agent_id},
                )
        if row is None:
            raise AlreadyExists(
                f"trigger {new.trigger_id!r} already exists in workspace {new.workspace_id!r}"
            )
        return pb.CreateTriggerResponse(trigger=await self._message(row), secret=secret or "")

    async def GetTrigger(
        self, request: pb.GetTriggerRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetTriggerResponse:
        ws = auth_context.workspace(request.workspace_id)
        row = await self._get(ws, validate.slug("trigger_id", request.trigger_id))
        return pb.GetTriggerResponse(trigger=await self._message(row))

    async def ListTriggers(
        self, request: pb.ListTriggersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListTriggersResponse:
        ws = auth_context.workspace(request.workspace_id)
        size = validate.in_range("page_size", request.page_size or 100, 1, 500)
        agent_id = validate.slug("agent_id", request.agent_id) if request.agent_id else None
        rows = await store.list_triggers(
            self._pool, ws, _id_from_token(request.page_token), agent_id, size + 1
        )
        token = _id_token(rows[size - 1]["trigger_id"]) if len(rows) > size else ""
        return pb.ListTriggersResponse(
            triggers=[await self._message(r) for r in rows[:size]], next_page_token=token
        )

    async def SetTriggerEnabled(
        self, request: pb.SetTriggerEnabledRequest, context: grpc.aio.ServicerContext
    ) -> pb.SetTriggerEnabledResponse:
        ws = auth_context.workspace(request.workspace_id)
        trigger_id = validate.slug("trigger_id", request.trigger_id)
        note = validate.text("note", request.note, max_bytes=MAX_NOTE_BYTES) or None
        async with transaction(self._pool) as conn:
            row = await schedule_ops.set_paused(
                conn, ws, trigger_id, enabled=request.enabled, note=note
            )
            action = "trigger.enabled" if request.enabled else "trigger.disabled"
            await audit.record(conn, action, "trigger", trigger_id, {"note": note})
        return pb.SetTriggerEnabledResponse(trigger=await self._message(row))

    async def RotateTriggerSecret(
        self, request: pb.RotateTriggerSecretRequest, context: grpc.aio.ServicerContext
    ) -> pb.RotateTriggerSecretResponse:
        ws = auth_context.workspace(request.workspace_id)
        row = await self._get(ws, validate.slug("trigger_id", request.trigger_id))
        if row["kind"] == "schedule":
            raise FailedPrecondition("schedules have no signing secret")
        grace = _seconds(request.grace) if request.HasField("grace") else DEFAULT_GRACE_SECONDS
        if not 0 <= grace <= MAX_GRACE_SECONDS:
            raise InvalidArgument("grace", f"must be between 0 and {MAX_GRACE_SECONDS} s")
        secret = _secret("secret", row["scheme"], request.secret)
        async with store.transaction(self._pool) as conn:
            await sealed_secrets.rotate(conn, self._envelope, ws, row["trigger_id"], secret, grace)
            await audit.record(
                conn,
                "trigger.secret_rotated",
                "trigger",
                row["trigger_id"],
                {"grace_seconds": grace},
            )
        row = await self._get(ws, row["trigger_id"])
        return pb.RotateTriggerSecretResponse(trigger=await self._message(row), secret=secret)

    async def ListTriggerEvents(
        self, request: pb.ListTriggerEventsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListTriggerEventsResponse:
        ws = auth_context.workspace(request.workspace_id)
        row = await self._get(ws, validate.slug("trigger_id", request.trigger_id))
        size = validate.in_range("page_size", request.page_size or 100, 1, 500)
        after = decode_page_token(request.page_token)
        rows = await store.list_events(self._pool, ws, row["trigger_id"], after, size + 1)
        last = rows[size - 1] if len(rows) > size else None
        token = encode_page_token(last["received_at"], last["event_id"]) if last else ""
        return pb.ListTriggerEventsResponse(
            events=[event_message(r) for r in rows[:size]], next_page_token=token
        )
