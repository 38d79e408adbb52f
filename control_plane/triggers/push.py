"""The push fetcher: turns "something changed" notifications into one event per message.

A push notification carries only a history id (Gmail's does). The ingress
records the newest announced id and queues a fetch (`fetch_due_at`). This
loop claims due fetches with a lease (`fetch_due_at` moves to the lease
expiry, so a fetcher that dies leaves the fetch due again), lists the changes
since the source's last processed id from its history URL, admits each
message as an event deduped on its Message-ID, and only then moves the last
processed id forward. A crash anywhere before that last write refetches the
same changes, and the dedupe key makes the refetch start nothing twice; two
overlapping fetches are just as harmless.

A source may name a connection (`config["connection_id"]`, a connected account of
`control_plane/connections/`): its history URL is then fetched with that connection's
access token (`Authorization: Bearer`), refreshed through the connection's single-flight
refresh when it is due, or once when the history API answers 401 (refresh once, retry
once). A connection that cannot be used (revoked, needs its owner to connect again, gone)
parks the fetch: `fetch_error` on the trigger says why, and nothing retries it every lease;
the next notification queues a fetch again.

History API (Gmail's `users.history.list`, the parts used):
`GET <history_url>?startHistoryId=N[&pageToken=T]` →
`{"history": [{"id": "12", "messagesAdded": [{"message": {<mail message>}}]}],
  "historyId": "15", "nextPageToken": "…"}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from control_plane.connections.tokens import (
    CallToken,
    ConnectionTokens,
    ConnectionUnavailable,
    ConnectionUnusable,
)
from control_plane.ground.config import RunDefaults
from control_plane.ground.errors import NotFound
from control_plane.store import triggers as store
from control_plane.triggers import admission, deliveries, mail
from control_plane.triggers.deliveries import Settings

log = logging.getLogger(__name__)

MAX_PAGES = 100


class FetchError(Exception):
    """The history URL did not answer with a history listing."""


class _Refused(Exception):
    """The history API refused the connection's token even after a refresh."""


class SourceParked(FetchError):
    """The source's connection cannot be used: the fetch is parked until a notification."""


@dataclass(frozen=True)
class FetchResult:
    messages: int
    runs_started: int
    history_id: int


def _history_page(data: Any) -> tuple[list[Any], int, int, str]:
    """One listing page: (messages added, highest record id, the mailbox's history id,
    next page token)."""
    if not isinstance(data, dict):
        raise FetchError("history listing is not a JSON object")
    try:
        mailbox_id = int(data.get("historyId", 0))
    except (TypeError, ValueError, OverflowError):
        raise FetchError("historyId is not an integer") from None
    records = data.get("history") or []
    if not isinstance(records, list):
        raise FetchError("history is not a list")
    messages, highest = [], 0
    for record in records:
        if not isinstance(record, dict):
            continue
        with contextlib.suppress(TypeError, ValueError, OverflowError):
            highest = max(highest, int(record.get("id", 0)))
        added = record.get("messagesAdded") or []
        for entry in added if isinstance(added, list) else []:
            messages.append(entry.get("message") if isinstance(entry, dict) else None)
    token = data.get("nextPageToken")
    return messages, highest, mailbox_id, token if isinstance(token, str) else ""


class PushFetcher:
    """Claims due fetches and admits what they find; `run()` is the control-plane loop."""

    def __init__(
        self,
        pool: store.Pool,
        defaults: RunDefaults,
        on_runnable: Callable[[], None],
        *,
        poll_seconds: float = 1.0,
        lease_seconds: float = 30.0,
        batch: int = 8,
        client: httpx.AsyncClient | None = None,
        tokens: ConnectionTokens | None = None,
    ) -> None:
        self._pool = pool
        self._defaults = defaults
        self._on_runnable = on_runnable
        self._poll = poll_seconds
        self._lease = lease_seconds
        self._batch = batch
        self._client = client or httpx.AsyncClient(timeout=10.0)
        self._tokens = tokens
        self._wake = asyncio.Event()

    def poke(self) -> None:
        """A fetch was queued on this replica: look now rather than at the next poll."""
        self._wake.set()

    async def run(self) -> None:
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._poll)
                self._wake.clear()
                try:
                    await self.fetch_due()
                except Exception as exc:  # noqa: BLE001 - the database may be restarting
                    log.warning("push fetch round failed, retrying: %s", exc)
        finally:
            await self._client.aclose()

    async def fetch_due(self) -> int:
        """Claim and run every due fetch; returns how many sources were fetched."""
        done = 0
        while rows := await store.claim_due_fetches(self._pool, self._batch, self._lease):
            for row in rows:
                try:
                    await self.fetch(row)
                except (FetchError, ConnectionUnavailable, httpx.HTTPError) as exc:
                    # Left leased: due again when the lease lapses (a parked source is
                    # not due at all until its next notification).
                    log.warning(
                        "fetch for %s/%s failed: %s", row["workspace_id"], row["trigger_id"], exc
                    )
                except Exception as exc:  # noqa: BLE001 - one source's failure is its own
                    # Whatever went wrong with this source, the others of the batch are
                    # still fetched now (they would wait out their lease otherwise).
                    log.error(
                        "fetch for %s/%s failed unexpectedly: %s: %s",
                        row["workspace_id"],
                        row["trigger_id"],
                        type(exc).__name__,
                        exc,
                    )
                done += 1
        return done

    async def fetch(self, row: Any) -> FetchResult:
        """Fetch a source's changes since its last processed id, admit them, then advance."""
        settings = Settings.of(row)
        start = row["last_history_id"] or 0
        auth = _Auth(self._tokens, settings.workspace_id, settings.config.get("connection_id"))
        try:
            messages, history_id = await self._changes(settings.config["history_url"], start, auth)
        except (ConnectionUnusable, NotFound, _Refused) as exc:
            reason = f"connection {auth.connection_id} cannot be used: {exc}"
            await store.park_push(self._pool, settings.workspace_id, settings.trigger_id, reason)
            raise SourceParked(reason) from None
        started = 0
        for doc in messages:
            try:
                message = mail.parse_message(doc)
            except mail.BadMessage as exc:
                log.warning("skipped a malformed message from %s: %s", settings.trigger_id, exc)
                continue
            depth = await admission.mail_chain_depth(self._pool, message)
            event = deliveries.mail_event(settings, message, depth)
            outcome = await admission.admit(self._pool, event, self._defaults)
            started += int(outcome.created and outcome.run_id is not None)
        # Only now, with every event of these changes committed, does the cursor move.
        await store.advance_push(self._pool, settings.workspace_id, settings.trigger_id, history_id)
        if started:
            self._on_runnable()
        return FetchResult(len(messages), started, history_id)

    async def _changes(self, url: str, start: int, auth: _Auth) -> tuple[list[Any], int]:
        """Every message added after `start`, and the history id they bring the source to."""
        params: dict[str, Any] = {"startHistoryId": start}
        messages: list[Any] = []
        history_id = start
        for _ in range(MAX_PAGES):
            response = await self._client.get(url, params=params, headers=await auth.headers())
            if response.status_code == 401 and await auth.rejected():
                response = await self._client.get(url, params=params, headers=await auth.headers())
            if response.status_code in (401, 403) and auth.connection_id:
                # A fresh token refused, or a scope missing: its owner must act, not a retry.
                raise _Refused(f"the history API answered {response.status_code} to its token")
            if response.status_code != 200:
                raise FetchError(f"history listing answered {response.status_code}")
            try:
                listing = response.json()
            except (ValueError, RecursionError):
                raise FetchError("history listing is not JSON") from None
            page, highest, mailbox_id, token = _history_page(listing)
            messages += page
            history_id = max(history_id, highest)
            if not token:
                # The whole listing was read: the mailbox's own id is where it stands.
                return messages, max(history_id, mailbox_id)
            params["pageToken"] = token
        # Pages left unread: advance only as far as the records actually read.
        return messages, history_id


class _Auth:
    """The Authorization header of one fetch: none, or its connection's access token, refreshed
    at most once after a 401 (a second 401 is the history API's answer, not a stale token)."""

    def __init__(
        self, tokens: ConnectionTokens | None, workspace_id: str, connection_id: str | None
    ) -> None:
        self.tokens, self.workspace_id = tokens, workspace_id
        self.connection_id = connection_id or ""
        self._token: CallToken | None = None
        self._retried = False

    async def headers(self) -> dict[str, str]:
        if not self.connection_id:
            return {}
        if self.tokens is None:
            raise FetchError("this replica has no connection tokens to fetch with")
        if self._token is None:
            self._token = await self.tokens.for_call(self.workspace_id, self.connection_id)
        return {"Authorization": f"Bearer {self._token.access_token}"}

    async def rejected(self) -> bool:
        """The token was refused: refresh it (once per fetch); whether to retry the call."""
        if not self.connection_id or self._token is None or self._retried or self.tokens is None:
            return False
        self._retried = True
        self._token = await self.tokens.after_rejection(self.workspace_id, self._token)
        return True
