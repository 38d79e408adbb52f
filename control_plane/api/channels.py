"""ChannelService: a workspace's notification channels (their secrets sealed, never shown)."""

from __future__ import annotations

import base64
import re
import secrets as random
import uuid
from typing import Any
from urllib.parse import urlsplit

import grpc

from agentrun.v1 import channel_pb2 as pb
from agentrun.v1 import channel_pb2_grpc
from control_plane.auth import audit
from control_plane.auth import context as auth_context
from control_plane.channels import lifecycle, secrets
from control_plane.channels.delivery import SLACK_API
from control_plane.crypto.envelope import Envelope
from control_plane.ground import convert, validate
from control_plane.ground.errors import AlreadyExists, InvalidArgument, NotFound
from control_plane.store import alerts as alert_store
from control_plane.store import channels as store
from control_plane.store.db import Pool, transaction

NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
TLS_MODES = {"starttls": 587, "tls": 465, "none": 25}


def to_proto(c: store.Channel) -> pb.Channel:
    cfg = c.config
    target = {
        "slack": cfg.get("api_url", ""),
        "email": f"{cfg.get('host')}:{cfg.get('port')}",
        "webhook": cfg.get("url", ""),
    }[c.kind]
    msg = pb.Channel(
        workspace_id=c.workspace_id,
        channel_id=str(c.channel_id),
        name=c.name,
        kind=c.kind,
        target=target,
    )
    if (ts := convert.timestamp(c.created_at)) is not None:
        msg.create_time.CopyFrom(ts)
    return msg


def _url(field: str, value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgument(field, "must be an http(s) URL")
    return validate.text(field, value, max_bytes=2000, required=True)


def _slack(s: pb.SlackChannel) -> tuple[dict[str, Any], str]:
    token = validate.text("slack.bot_token", s.bot_token, max_bytes=500, required=True)
    if not token.startswith("xoxb-"):
        raise InvalidArgument("slack.bot_token", "must be a bot token (xoxb-...)")
    return {"api_url": _url("slack.api_url", s.api_url or SLACK_API)}, token


def _email(e: pb.EmailChannel) -> tuple[dict[str, Any], str]:
    tls = e.tls or "starttls"
    if tls not in TLS_MODES:
        raise InvalidArgument("email.tls", "must be starttls, tls or none")
    sender = validate.text("email.sender", e.sender, max_bytes=320, required=True)
    if "@" not in sender:
        raise InvalidArgument("email.sender", "must be an e-mail address")
    cfg = {
        "host": validate.text("email.host", e.host, max_bytes=255, required=True),
        "port": validate.in_range("email.port", e.port or TLS_MODES[tls], 1, 65535),
        "sender": sender,
        "username": validate.text("email.username", e.username, max_bytes=320),
        "tls": tls,
    }
    return cfg, validate.text("email.password", e.password, max_bytes=500)


def _webhook(w: pb.WebhookChannel) -> tuple[dict[str, Any], str, bool]:
    """Its config, its signing secret, and whether the server made the secret."""
    cfg: dict[str, Any] = {"url": _url("webhook.url", w.url)}
    for i, event in enumerate(w.events):
        if event not in lifecycle.EVENTS:
            raise InvalidArgument(f"webhook.events[{i}]", "must be run.completed or run.failed")
    if w.events:
        cfg["events"] = sorted(set(w.events))
    if w.agent_id:
        cfg["agent_id"] = validate.slug("webhook.agent_id", w.agent_id)
    if not w.secret:
        return cfg, "whsec_" + base64.b64encode(random.token_bytes(32)).decode(), True
    if not w.secret.startswith("whsec_"):
        raise InvalidArgument("webhook.secret", "must be whsec_ followed by base64")
    try:
        base64.b64decode(w.secret.removeprefix("whsec_"), validate=True)
    except ValueError:
        raise InvalidArgument("webhook.secret", "must be whsec_ followed by base64") from None
    return cfg, w.secret, False


def parse(request: pb.AddChannelRequest) -> tuple[str, dict[str, Any], str, bool]:
    """kind, config, secret, and whether the secret was made here."""
    which = request.WhichOneof("kind")
    if which == "slack":
        return ("slack", *_slack(request.slack), False)
    if which == "email":
        return ("email", *_email(request.email), False)
    if which == "webhook":
        return ("webhook", *_webhook(request.webhook))
    raise InvalidArgument("kind", "must be slack, email or webhook")


class ChannelServicer(channel_pb2_grpc.ChannelServiceServicer):
    def __init__(self, pool: Pool, envelope: Envelope) -> None:
        self._pool = pool
        self._envelope = envelope

    async def AddChannel(
        self, request: pb.AddChannelRequest, context: grpc.aio.ServicerContext
    ) -> pb.AddChannelResponse:
        ws = auth_context.workspace(request.workspace_id)
        if not NAME.match(request.name):
            raise InvalidArgument("name", "lowercase letters, digits, '-' and '_', 1-63 characters")
        kind, config, secret, made = parse(request)
        channel_id = uuid.uuid4()
        sealed = await secrets.seal(self._envelope, ws, channel_id, secret) if secret else None
        async with transaction(self._pool) as conn:
            row = await store.insert(conn, ws, channel_id, kind, request.name, config, sealed)
            if row is None:
                raise AlreadyExists(f"channel {request.name!r} exists")
            detail = {"name": request.name, "kind": kind}
            await audit.record(conn, "channel.added", "channel", str(channel_id), detail)
        return pb.AddChannelResponse(channel=to_proto(row), webhook_secret=secret if made else "")

    async def ListChannels(
        self, request: pb.ListChannelsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListChannelsResponse:
        ws = auth_context.workspace(request.workspace_id)
        return pb.ListChannelsResponse(
            channels=[to_proto(c) for c in await store.list_all(self._pool, ws)]
        )

    async def RemoveChannel(
        self, request: pb.RemoveChannelRequest, context: grpc.aio.ServicerContext
    ) -> pb.RemoveChannelResponse:
        ws = auth_context.workspace(request.workspace_id)
        async with transaction(self._pool) as conn:
            if not await store.delete(conn, ws, request.name):
                raise NotFound(f"channel {request.name!r} not found")
            await audit.record(conn, "channel.removed", "channel", request.name, {})
        return pb.RemoveChannelResponse()

    async def AddAlertRule(
        self, request: pb.AddAlertRuleRequest, context: grpc.aio.ServicerContext
    ) -> pb.AddAlertRuleResponse:
        rule = request.rule
        ws = auth_context.workspace(request.workspace_id)
        found = {c.name: c for c in await store.list_all(self._pool, ws)}.get(rule.channel)
        if found is None:
            raise InvalidArgument("rule.channel", f"no channel {rule.channel!r} in this workspace")
        new = new_alert_rule(ws, rule, found)
        async with transaction(self._pool) as conn:
            row = await alert_store.insert(conn, new)
            if row is None:
                raise AlreadyExists(f"alert rule {rule.name!r} exists")
            detail = {"name": rule.name, "kind": new.kind, "channel": rule.channel}
            await audit.record(conn, "alert_rule.added", "alert_rule", rule.name, detail)
        return pb.AddAlertRuleResponse(rule=alert_to_proto(row))

    async def ListAlertRules(
        self, request: pb.ListAlertRulesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListAlertRulesResponse:
        ws = auth_context.workspace(request.workspace_id)
        rows = await alert_store.list_all(self._pool, ws)
        return pb.ListAlertRulesResponse(rules=[alert_to_proto(r) for r in rows])

    async def RemoveAlertRule(
        self, request: pb.RemoveAlertRuleRequest, context: grpc.aio.ServicerContext
    ) -> pb.RemoveAlertRuleResponse:
        ws = auth_context.workspace(request.workspace_id)
        async with transaction(self._pool) as conn:
            if not await alert_store.delete(conn, ws, request.name):
                raise NotFound(f"alert rule {request.name!r} not found")
            await audit.record(conn, "alert_rule.removed", "alert_rule", request.name, {})
        return pb.RemoveAlertRuleResponse()


DAY = 86400


def new_alert_rule(ws: str, rule: pb.AlertRule, channel: store.Channel) -> alert_store.NewRule:
    """The validated rule AddAlertRule describes (every field named when it is wrong)."""
    if not NAME.match(rule.name):
        raise InvalidArgument(
            "rule.name", "lowercase letters, digits, '-' and '_', 1-63 characters"
        )
    recipient = validate.text("rule.recipient", rule.recipient, max_bytes=320)
    if channel.kind != "webhook" and not recipient:
        raise InvalidArgument(
            "rule.recipient", f"a {channel.kind} channel needs the Slack channel or address to tell"
        )
    which = rule.WhichOneof("condition")
    base: dict[str, Any] = {
        "workspace_id": ws,
        "name": rule.name,
        "channel_id": channel.channel_id,
        "recipient": recipient,
    }
    if which == "failure_rate":
        fr = rule.failure_rate
        if not 0 < fr.threshold <= 1:
            raise InvalidArgument("rule.failure_rate.threshold", "must be in (0, 1] (0.2 = 20 %)")
        return alert_store.NewRule(
            **base,
            kind="failure_rate",
            agent_id=_agent(fr.agent_id, "rule.failure_rate.agent_id"),
            threshold=fr.threshold,
            min_finished=validate.in_range(
                "rule.failure_rate.min_finished", fr.min_finished, 1, 1_000_000
            ),
            window_seconds=validate.in_range(
                "rule.failure_rate.window_seconds", fr.window_seconds, 60, 30 * DAY
            ),
        )
    if which == "stuck_on_person":
        sp = rule.stuck_on_person
        return alert_store.NewRule(
            **base,
            kind="stuck_on_person",
            agent_id=_agent(sp.agent_id, "rule.stuck_on_person.agent_id"),
            waiting_seconds=validate.in_range(
                "rule.stuck_on_person.waiting_seconds", sp.waiting_seconds, 60, 30 * DAY
            ),
        )
    raise InvalidArgument("rule.condition", "set failure_rate or stuck_on_person")


def _agent(agent_id: str, field: str) -> str | None:
    return validate.slug(field, agent_id) if agent_id else None


def alert_to_proto(row: Any) -> pb.AlertRule:
    msg = pb.AlertRule(
        workspace_id=row["workspace_id"],
        name=row["name"],
        channel=row["channel_name"] or "",
        recipient=row["recipient"],
        fire_count=row["fire_count"],
    )
    if row["kind"] == "failure_rate":
        msg.failure_rate.CopyFrom(
            pb.FailureRate(
                agent_id=row["agent_id"] or "",
                threshold=row["threshold"],
                min_finished=row["min_finished"],
                window_seconds=row["window_seconds"],
            )
        )
    else:
        msg.stuck_on_person.CopyFrom(
            pb.StuckOnPerson(agent_id=row["agent_id"] or "", waiting_seconds=row["waiting_seconds"])
        )
    for name, column in (
        ("fire_time", "fired_at"),
        ("resolve_time", "resolved_at"),
        ("create_time", "created_at"),
    ):
        if (ts := convert.timestamp(row[column])) is not None:
            getattr(msg, name).CopyFrom(ts)
    return msg
