"""The streams the platform writes, served read-only under the Durable Streams protocol
(control_plane/http/streams.py, docs/streams.md), as projections of what Postgres already
keeps: nothing more is written on the commit path.

* `_agentrun/runs/{run_id}`: the run's steps, each `{"step": ...}` as ListRunSteps and
  WatchRun give it (the HTTP API's JSON of the Step message); offset `SSSS_0000` after step
  seq S-1. It is closed once the run has ended and its last step is read.
* `_agentrun/sessions/{session_id}`: every turn's steps in order, each
  `{"turn": T, "run_id": ..., "step": ...}`; offset `TTTT_SSSS` after turn T's step S-1.
* `_agentrun/feed`: the workspace's events in commit order (the `workspace_events` rows
  the triggers of migration 0041 write), each `{"event": kind, "id": ..., "at": ...,
  "detail": {...}}`; offset `XXXX_EEEE` after event E of transaction X.

Each view is its reader's (control_plane/auth/privacy.py): a private session's stream and
its turns' runs' streams do not exist for a reader who is not a member (404), and the feed
leaves out their events inside its query, so its offsets stay the events' own and a page is
never empty while visible events follow; its tail is the reader's last visible event. A
reader below operator is served each step as privacy.project_step projects it.

Every value is written the one way (control_plane/store/streams.py's `js_json`), so two
readers from the same offset receive the same bytes.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

from control_plane.api.runs import TERMINAL
from control_plane.auth import privacy
from control_plane.ground import convert
from control_plane.http import jsonmap
from control_plane.store import privacy as privacy_store
from control_plane.store import streams as store
from control_plane.store.db import Pool
from control_plane.store.queries import run
from control_plane.store.steps import Step

PREFIX = "_agentrun/"
JSON = "application/json"
PAGE = 500


def is_platform(path: str) -> bool:
    return path == PREFIX.rstrip("/") or path.startswith(PREFIX)


def is_feed(path: str) -> bool:
    return path == f"{PREFIX}feed"


def _offset(high: int, low: int) -> str:
    return f"{high:016d}_{low:016d}"


def _stream(
    ws: str, path: str, tail: str, closed: bool, reader: str | None, internals: bool
) -> store.Stream:
    return store.Stream(
        workspace_id=ws,
        stream_id=0,
        path=path,
        content_type=JSON,
        ttl_seconds=None,
        expires_at=None,
        tail_offset=tail,
        closed=closed,
        closed_by=None,
        last_seq=None,
        forked_from=None,
        fork_offset=None,
        fork_sub_offset=None,
        ref_count=0,
        soft_deleted=False,
        reader=reader,
        internals=internals,
    )


def _uuid(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


def _message(offset: str, value: dict[str, Any]) -> store.Message:
    return store.Message(offset, (store.js_json(value) + ",").encode())


def _step(step: Step, internals: bool) -> dict[str, Any]:
    return jsonmap.to_json(convert.step(privacy.project_step(step, internals)))


@dataclass(frozen=True)
class Tail:
    """A run's or a session's stream as it is now, the same for every reader: its tail, and
    the private session whose members alone may see it (None: every reader may)."""

    stream: store.Stream  # as a reader who sees everything sees it
    private_session: uuid.UUID | None


async def tail(pool: Pool, ws: str, path: str) -> Tail | None:
    """The run or session stream at `path` as it is now (None: no such run or session, or
    not a run's or a session's stream): one query, whoever reads."""
    kind, _, name = path.removeprefix(PREFIX).partition("/")
    key = _uuid(name)
    if key is None or "/" in name:
        return None
    if kind == "runs":
        row = await run(pool, "stream_run_tail", ws, key)
        if row is None:
            return None
        last = row["last_seq"]
        at = _offset(last + 1, 0) if last is not None else store.ZERO
        if row["delta_seq"] is not None:  # its model call under way
            at = store.run_delta_offset(row["delta_seq"], row["delta_epoch"], row["delta_idx"])
        stream = _stream(ws, path, at, row["status"] in TERMINAL, None, True)
        return Tail(stream, row["private_session"])
    if kind == "sessions":
        row = await run(pool, "stream_session_tail", ws, key)
        if row is None:
            return None
        last = row["last_seq"]
        at = _offset(row["turn"], last + 1) if last is not None else store.ZERO
        return Tail(_stream(ws, path, at, False, None, True), key if row["private"] else None)
    return None


def hidden_from(at: Tail, reader: str | None, members: Collection[str]) -> bool:
    """Whether `reader` may not see the stream: a private session's, and the reader (not
    one who sees everything) not among its `members` as they are now."""
    return at.private_session is not None and reader is not None and reader not in members


async def hidden(pool: Pool, ws: str, at: Tail, reader: str | None) -> bool:
    """hidden_from(), its members read only when the stream is a private session's."""
    if at.private_session is None or reader is None:
        return False
    return hidden_from(at, reader, await privacy_store.members(pool, ws, at.private_session))


def seen_by(at: Tail, reader: str | None, internals: bool) -> store.Stream:
    """The stream as `reader` sees it (one who may: hidden() said so)."""
    return replace(at.stream, reader=reader, internals=internals)


async def view(
    pool: Pool, ws: str, path: str, reader: str | None, internals: bool
) -> store.Stream | None:
    """The platform stream at `path` as it is now, as `reader` sees it (None: no such run,
    session or stream, or one the reader may not see); its steps whole when `internals`,
    else projected (privacy.project_step)."""
    rest = path.removeprefix(PREFIX)
    kind, _, name = rest.partition("/")
    if kind == "feed" and not name:
        row = await run(pool, "stream_feed_tail", workspace_id=ws, reader=reader)
        at = _offset(int(row["xid"]), row["event_id"]) if row else store.ZERO
        return _stream(ws, path, at, False, reader, internals)
    now = await tail(pool, ws, path)
    if now is None or await hidden(pool, ws, now, reader):
        return None
    return seen_by(now, reader, internals)


async def read(pool: Pool, stream: store.Stream, after: str) -> tuple[list[store.Message], bool]:
    """The platform stream's messages after `after`, a page at a time."""
    ws = stream.workspace_id
    kind, _, name = stream.path.removeprefix(PREFIX).partition("/")
    high, low = store.offset_parts(after)
    messages: list[store.Message] = []
    if kind == "feed":
        rows = await run(
            pool,
            "stream_feed_after",
            workspace_id=ws,
            xid=str(high),
            event_id=low,
            page_size=PAGE,
            reader=stream.reader,
        )
        for r in rows:
            value = {
                "event": r["kind"],
                "id": r["object_id"],
                "at": r["at"].isoformat(),
                "detail": json.loads(r["detail"]),
            }
            messages.append(_message(_offset(int(r["xid"]), r["event_id"]), value))
    elif kind == "runs":
        return await _run_messages(pool, ws, uuid.UUID(name), high, low, stream.internals)
    else:
        rows = await run(pool, "stream_session_steps", ws, uuid.UUID(name), high, low, PAGE)
        for step, r in zip(Step.of_rows(rows), rows, strict=True):
            step_json = _step(step, stream.internals)
            value = {"turn": r["turn"], "run_id": str(step.run_id), "step": step_json}
            messages.append(_message(_offset(r["turn"], step.seq + 1), value))
    return messages, len(rows) < PAGE


async def _run_messages(
    pool: Pool, ws: str, run_id: uuid.UUID, high: int, low: int, internals: bool
) -> tuple[list[store.Message], bool]:
    """A run's steps after (high, low) and, after its last step, the deltas of the model
    call under way: `{"delta": {"seq", "epoch", "index", "text"}}` between step seq-1 and
    the decision step seq (deltas of committed decisions are not served), and before a new
    holder's first delta of a call an earlier holder had begun, `{"break": {"seq",
    "epoch"}}`."""
    rows = await run(pool, "steps_list", ws, run_id, high, PAGE)
    steps = Step.of_rows(rows)
    messages = [
        _message(store.run_step_offset(s.seq), {"step": _step(s, internals)}) for s in steps
    ]
    if len(rows) == PAGE:
        return messages, False
    after_steps = steps[-1].seq + 1 if steps else high
    deltas = await run(pool, "stream_run_deltas", ws, run_id, after_steps, high, low, PAGE)
    for d in deltas:
        if d["taken_over"] and (d["seq"], d["epoch"] * store.DELTAS_PER_EPOCH) > (high, low):
            # The holder streaming this call was taken over (it died, or lost its lease):
            # its deltas stop here, and the new holder's, asking again, follow.
            value = {"break": {"seq": d["seq"], "epoch": d["epoch"]}}
            messages.append(_message(store.run_break_offset(d["seq"], d["epoch"]), value))
        value = {
            "delta": {"seq": d["seq"], "epoch": d["epoch"], "index": d["idx"], "text": d["text"]}
        }
        messages.append(_message(store.run_delta_offset(d["seq"], d["epoch"], d["idx"]), value))
    messages.sort(key=lambda m: m.offset)  # a call's last deltas before its decision
    return messages, len(deltas) < PAGE
