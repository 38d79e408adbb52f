"""POST /hooks/{workspace_id}/{trigger_id}: signed deliveries from webhook senders and mail providers.

Synchronously and nothing more: look the trigger up, read the body (bounded),
verify the signature against the trigger's active secrets, parse, apply the
cheap filters, and record the event with its run in one statement under
unique (trigger_id, dedupe_key). The answer is 202 with the event id, its
status and its run id, the same for every redelivery. Nothing waits for the
model. Refusals store nothing: unknown or disabled trigger 404, body over the
limit 413, bad signature or stale timestamp 401, malformed body 400.

A push source ("something changed", with only a history id) records the id
and queues a fetch; the fetcher turns the fetched messages into events.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from control_plane.crypto.envelope import CannotOpen
from control_plane.ground import validate
from control_plane.ground.errors import AlreadyExists, InvalidArgument
from control_plane.http.context import HttpContext
from control_plane.http.errors import error, json_errors
from control_plane.runs import events
from control_plane.store import triggers as store
from control_plane.triggers import admission, deliveries, sealed_secrets, signatures
from control_plane.triggers.deliveries import BadDelivery, Settings

log = logging.getLogger(__name__)

PATH = "/hooks/{workspace_id}/{trigger_id}"


class TooLarge(Exception):
    """The body is over the ingress limit."""


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, refusing (TooLarge) as soon as it passes `limit` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise TooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


class WebhookIngress:
    def __init__(self, ctx: HttpContext) -> None:
        self._ctx = ctx

    async def receive(self, request: Request) -> Response:
        limit = self._ctx.config.webhook_max_body_bytes
        try:
            found = await self._trigger(request)
        except CannotOpen as exc:
            # Misconfigured keys, not the sender's fault: 503 so it retries later.
            log.error("cannot verify deliveries: %s", exc)
            return error(503, "this trigger's signing secrets are unavailable")
        if found is None:
            return error(404, "no such trigger")
        settings, secrets = found
        try:
            raw = await read_body(request, limit)
        except TooLarge:
            return error(413, f"body is larger than {limit} bytes")
        try:
            signatures.verify(
                settings.scheme or "",
                signatures.Delivery.of(raw, request.headers),
                secrets,
                now=time.time(),
                tolerance=settings.tolerance,
            )
        except signatures.SignatureError as exc:
            log.info(
                "refused a delivery to %s/%s: %s", settings.workspace_id, settings.trigger_id, exc
            )
            return error(401, str(exc))
        try:
            doc = deliveries.parse_body(raw, request.headers.get("content-type", ""))
            return await self._accept(settings, request.headers, doc)
        except BadDelivery as exc:
            return error(400, str(exc))

    async def _trigger(self, request: Request) -> tuple[Settings, list[str]] | None:
        """The trigger's settings and its active secrets, opened; None if no such trigger."""
        try:
            ws = validate.slug("workspace_id", request.path_params["workspace_id"])
            trigger_id = validate.slug("trigger_id", request.path_params["trigger_id"])
        except InvalidArgument:
            return None
        found = await sealed_secrets.for_delivery(
            self._ctx.pool, self._ctx.envelope, ws, trigger_id
        )
        return None if found is None else (Settings.of(found[0]), found[1])

    async def _accept(self, settings: Settings, headers: Mapping[str, str], doc: Any) -> Response:
        if settings.kind == "mail_push":
            return await self._queue_fetch(settings, deliveries.push_history_id(doc))
        if settings.kind == "mail":
            message = deliveries.parse_mail(doc)
            depth = await admission.mail_chain_depth(self._ctx.pool, message)
            event = deliveries.mail_event(settings, message, depth)
        elif (
            settings.scheme == "slack"
            and isinstance(doc, dict)
            and doc.get("type") == "url_verification"
        ):
            # Slack checks a new Events API URL with a signed challenge: echo it, store nothing.
            return JSONResponse({"challenge": str(doc.get("challenge", ""))})
        else:
            event = deliveries.webhook_event(settings, headers, doc)
            if settings.publish_event:
                return await self._publish(settings, event, doc)
        outcome = await admission.admit(self._ctx.pool, event, self._ctx.config.defaults)
        if outcome.created and outcome.run_id:
            self._ctx.on_runnable()
        return JSONResponse(outcome.reply(), status_code=202)

    async def _publish(self, settings: Settings, event: admission.Event, doc: Any) -> Response:
        """Publish the delivery as an event (control_plane/runs/events.py) instead of starting
        a run; a redelivery (the same dedupe key) is the same event and wakes nothing more."""
        if event.filtered is not None:
            return JSONResponse({"status": "filtered", "reason": event.filtered}, status_code=202)
        body = doc if isinstance(doc, dict) else {"data": doc}
        wanted = events.Outgoing(
            settings.workspace_id,
            settings.publish_event,
            f"{settings.trigger_id}:{event.dedupe_key}"[: events.MAX_EVENT_ID_BYTES],
            body,
            f"trigger:{settings.trigger_id}",
        )
        if len(wanted.canonical.encode()) > events.MAX_BODY_BYTES:
            return error(413, f"an event's body is at most {events.MAX_BODY_BYTES} bytes")
        try:
            published = await events.publish(
                self._ctx.pool, wanted, self._ctx.on_runnable, _no_cancel_poke
            )
        except AlreadyExists:  # the same dedupe key with another body: the first stands
            return JSONResponse({"event_id": wanted.event_id, "status": "duplicate"}, 202)
        ev = published.event
        reply = {
            "event_id": ev.event_id,
            "status": "published" if published.created else "duplicate",
            "woke": ev.woke,
            "cancelled": ev.cancelled,
        }
        return JSONResponse(reply, status_code=202)

    async def _queue_fetch(self, settings: Settings, history_id: int) -> Response:
        await store.announce(self._ctx.pool, settings.workspace_id, settings.trigger_id, history_id)
        self._ctx.on_fetch_queued()
        return JSONResponse({"status": "fetch_queued", "history_id": history_id}, status_code=202)


def _no_cancel_poke(workspace_id: str, run_id: Any) -> None:
    """A run cancelled by a trigger's event: its holder is fenced at its next commit."""


def routes(ctx: HttpContext) -> list[Route]:
    ingress = WebhookIngress(ctx)
    return [Route(PATH, json_errors(ingress.receive), methods=["POST"])]
