"""Sessions: conversations with an agent, one turn (one run) at a time.

Sending a message admits the session's next run on the server, under the
session row's lock. If the previous turn's run has not ended, the strategy
(the message's, else the session's; migration 0021) decides: `reject` refuses
with ABORTED (HTTP 409) naming that turn; `enqueue` admits the turn parked,
and the end of the turn before it wakes it; `interrupt` cancels the unfinished
turns (run_cancel: their executors are fenced at their next commit) and admits
the new one at once; `rollback` does the same and leaves the cancelled turn
out of every later transcript. Two turns of one conversation never run at once. The new run's input step carries the
transcript of the earlier turns (`history`: each user message and the answer
the agent gave), which the executor puts before the new message, so the
model sees the conversation so far. `Conversations` is the domain; the gRPC
servicer and the HTTP route are thin doors to it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import grpc

from agentrun.v1 import session_pb2, session_pb2_grpc
from control_plane.api.runs import TERMINAL, decode_page_token, encode_page_token
from control_plane.auth import audit, privacy
from control_plane.auth import context as auth_context
from control_plane.dispatch import fast_path
from control_plane.ground import convert, validate
from control_plane.ground.config import RunDefaults
from control_plane.ground.errors import Aborted, FailedPrecondition, InvalidArgument, NotFound
from control_plane.ops import run_figures
from control_plane.store import agents as agent_store
from control_plane.store import canary as canary_store
from control_plane.store import privacy as privacy_store
from control_plane.store import runs as run_store
from control_plane.store import sessions as store
from control_plane.store.admission import MAX_INPUT_BYTES, admission
from control_plane.store.db import Pool, transaction

REJECT, ENQUEUE, INTERRUPT, ROLLBACK = "reject", "enqueue", "interrupt", "rollback"
STRATEGY_FROM_PROTO = {
    session_pb2.SESSION_STRATEGY_REJECT: REJECT,
    session_pb2.SESSION_STRATEGY_ENQUEUE: ENQUEUE,
    session_pb2.SESSION_STRATEGY_INTERRUPT: INTERRUPT,
    session_pb2.SESSION_STRATEGY_ROLLBACK: ROLLBACK,
}
STRATEGY_TO_PROTO = {name: value for value, name in STRATEGY_FROM_PROTO.items()}
VISIBILITY_FROM_PROTO = {
    session_pb2.SESSION_VISIBILITY_WORKSPACE: privacy.WORKSPACE,
    session_pb2.SESSION_VISIBILITY_PRIVATE: privacy.PRIVATE,
}
VISIBILITY_TO_PROTO = {name: value for value, name in VISIBILITY_FROM_PROTO.items()}


def visibility(field: str, value: int) -> str | None:
    """A request's visibility (None for UNSPECIFIED); INVALID_ARGUMENT naming `field` else."""
    if value == session_pb2.SESSION_VISIBILITY_UNSPECIFIED:
        return None
    if value not in VISIBILITY_FROM_PROTO:
        raise InvalidArgument(field, f"unknown session visibility {value}")
    return VISIBILITY_FROM_PROTO[value]


def strategy(field: str, value: int) -> str | None:
    """A request's strategy (None for UNSPECIFIED); INVALID_ARGUMENT naming `field` else."""
    if value == session_pb2.SESSION_STRATEGY_UNSPECIFIED:
        return None
    if value not in STRATEGY_FROM_PROTO:
        raise InvalidArgument(field, f"unknown session strategy {value}")
    return STRATEGY_FROM_PROTO[value]


# The transcript a turn carries: at most this many earlier turns and bytes (oldest dropped).
MAX_HISTORY_TURNS = 100
MAX_HISTORY_BYTES = 256 * 1024


def transcript(turns: Sequence[Any], max_bytes: int = MAX_HISTORY_BYTES) -> list[dict[str, str]]:
    """Earlier turns as chat messages, oldest first: each user message, then the agent's
    answer when the turn completed with one. Whole turns are dropped from the start to fit."""
    per_turn = []
    for turn in turns:
        messages = [{"role": "user", "content": turn["input"]}]
        if turn["status"] == "completed" and turn["output"]:
            messages.append({"role": "assistant", "content": turn["output"]})
        per_turn.append(messages)
    sizes = [len(json.dumps(m).encode()) for m in per_turn]
    while per_turn and sum(sizes) > max_bytes:
        per_turn.pop(0)
        sizes.pop(0)
    return [message for messages in per_turn for message in messages]


class Conversations:
    """Create sessions, send messages (admitting turns), read them back."""

    def __init__(
        self,
        pool: Pool,
        defaults: RunDefaults,
        on_runnable: Callable[[], None],
        on_cancel: Callable[[str, uuid.UUID], None] = lambda ws, run_id: None,
        fast: fast_path.FastPath | None = None,
    ) -> None:
        self._pool = pool
        self._defaults = defaults
        self._on_runnable = on_runnable
        self._on_cancel = on_cancel
        # The fast path (control_plane/dispatch/fast_path.py); None: every turn is claimed.
        self._fast_path = fast

    async def create(
        self,
        workspace_id: str,
        agent_id: str,
        title: str,
        strategy: str = REJECT,
        visibility: str = privacy.WORKSPACE,
        members: list[str] | None = None,
    ) -> tuple[Any, list[str]]:
        """The new session and its members: the caller (when a request is served) and
        `members`."""
        if await agent_store.get_agent(self._pool, workspace_id, agent_id) is None:
            raise NotFound(f"agent {agent_id!r} not found")
        creator = privacy.member_label()
        everyone = sorted({*(members or []), *([creator] if creator else [])})
        async with transaction(self._pool) as conn:
            row = await store.create_session(
                conn, workspace_id, agent_id, title, strategy, visibility=visibility
            )
            await privacy_store.add_members(
                conn, workspace_id, row["session_id"], everyone, creator
            )
        return row, everyone

    async def get(self, workspace_id: str, session_id: uuid.UUID) -> tuple[Any, Any]:
        """The session and its latest turn (None before the first); NOT_FOUND for one the
        caller may not see (control_plane/auth/privacy.py)."""
        await privacy.check_session(self._pool, workspace_id, session_id, privacy.reader())
        row = await store.get_session(self._pool, workspace_id, session_id)
        if row is None:
            raise NotFound(f"session {session_id} not found")
        last = await store.recent_turns(self._pool, workspace_id, session_id, 1)
        return row, last[0] if last else None

    async def members(self, workspace_id: str, session_id: uuid.UUID) -> list[str]:
        return await privacy_store.members(self._pool, workspace_id, session_id)

    async def update_members(
        self,
        workspace_id: str,
        session_id: uuid.UUID,
        add: list[str],
        remove: list[str],
        visibility: str | None,
    ) -> tuple[Any, Any]:
        """Add and remove members, or change the visibility, of a session the caller sees."""
        await self.get(workspace_id, session_id)
        async with transaction(self._pool) as conn:
            if await store.lock_session(conn, workspace_id, session_id) is None:
                raise NotFound(f"session {session_id} not found")
            await privacy_store.remove_members(conn, workspace_id, session_id, remove)
            await privacy_store.add_members(
                conn, workspace_id, session_id, add, privacy.member_label()
            )
            if visibility is not None:
                await privacy_store.set_visibility(conn, workspace_id, session_id, visibility)
            detail = {"add": add, "remove": remove, "visibility": visibility}
            await audit.record(
                conn,
                "session.members",
                "session",
                str(session_id),
                detail,
                workspace_id=workspace_id,
            )
        # Read as the platform: a caller who just removed itself still gets the answer.
        row = await store.get_session(self._pool, workspace_id, session_id)
        last = await store.recent_turns(self._pool, workspace_id, session_id, 1)
        return row, last[0] if last else None

    async def page(
        self, workspace_id: str, agent_id: str, after: tuple[datetime, uuid.UUID] | None, size: int
    ) -> list[Any]:
        """A page of the workspace's sessions the caller may see, newest first, after the
        token's one."""
        return await store.list_sessions(
            self._pool, workspace_id, agent_id, after, size, reader=privacy.reader()
        )

    async def turns(
        self, workspace_id: str, session_id: uuid.UUID, from_turn: int, limit: int
    ) -> list[Any]:
        await self.get(workspace_id, session_id)
        return await store.list_turns(self._pool, workspace_id, session_id, from_turn, limit)

    async def send(
        self,
        workspace_id: str,
        session_id: uuid.UUID,
        text: str,
        request_id: str | None,
        strategy: str | None = None,
        priority: int = 0,
        release: str | None = None,
    ) -> tuple[Any, bool]:
        """The turn this message started (and True), or the one its request_id started.

        With `release` (the contract canary's, deploys/canary.py) the turn is on that
        release from its admission, and only a stream of it may take it. A queued turn of a fast-path version is leased in the same transaction (its own
        savepoint: a refused lease leaves the turn queued) and handed to the executor
        once that committed (control_plane/dispatch/fast_path.py); the turn returned is
        then read again, so it shows what happened (running, or further along)."""
        leased: list[fast_path.Leased] = []
        try:
            row, cancelled = await self._admit(
                workspace_id, session_id, text, request_id, strategy, leased, priority, release
            )
        except BaseException:
            for lease in leased:  # nothing committed: the slot is free again
                lease.give_back()
            raise
        if cancelled is None:
            return row, False
        for run_id in cancelled:
            self._on_cancel(workspace_id, run_id)
        if leased and self._fast_path and await self._fast_path.hand_over(leased[0]):
            # Dispatched here: the turn as it is now (running), not as it was admitted.
            fresh = await store.list_turns(self._pool, workspace_id, session_id, row["turn"], 1)
            return (fresh[0] if fresh else row), True
        self._on_runnable()
        return row, True

    async def _admit(
        self,
        workspace_id: str,
        session_id: uuid.UUID,
        text: str,
        request_id: str | None,
        strategy: str | None,
        leased: list[fast_path.Leased],
        priority: int = 0,
        release: str | None = None,
    ) -> tuple[Any, list[uuid.UUID] | None]:
        """The admission transaction: the turn and the turns it cancelled (None: the turn
        its request_id started before); a fast-path lease taken goes into `leased`."""
        cancelled: list[uuid.UUID] = []
        async with transaction(self._pool) as conn:
            session = await store.lock_session(conn, workspace_id, session_id)
            if session is None:
                raise NotFound(f"session {session_id} not found")
            await privacy.check_session(conn, workspace_id, session_id, privacy.reader())
            if request_id:
                existing = await store.turn_by_request(conn, workspace_id, session_id, request_id)
                if existing is not None:
                    return existing, None
            await store.lock_unfinished(conn, workspace_id, session_id)
            unfinished = await _unfinished(conn, workspace_id, session_id)
            how = strategy or session["strategy"]
            if unfinished and how == REJECT:
                _refuse(unfinished[-1])
            if unfinished and how in (INTERRUPT, ROLLBACK):
                cancelled = await _cancel_turns(conn, session, unfinished, how)
            adm, version = await self._admission(conn, session, text, request_id, priority)
            row = await store.admit_turn(conn, adm)
            if release is not None:
                await canary_store.pin(conn, workspace_id, row["run_id"], release)
            if unfinished and how == ENQUEUE:
                await store.park_turn(conn, workspace_id, row["run_id"])
                (row,) = await store.list_turns(conn, workspace_id, session_id, adm.turn, 1)
            elif self._fast_path is not None and fast_path.wanted(version):
                tools = fast_path.code_tools(version)
                leased += await self._fast_path.lease_in(
                    conn, workspace_id, row["run_id"], tools, release
                )
        return row, cancelled

    async def _admission(
        self, conn: Any, session: Any, text: str, request_id: str | None, priority: int = 0
    ) -> tuple[store.TurnAdmission, Any]:
        """The turn's admission, and the agent version it runs."""
        ws, session_id = session["workspace_id"], session["session_id"]
        version = await agent_store.get_version(conn, ws, session["agent_id"], 0)
        if version is None:
            raise FailedPrecondition(f"agent {session['agent_id']!r} has no published version")
        turn = session["turn_count"] + 1
        payload = {
            "text": text,
            "history": await store.history(conn, ws, session_id, turn),
            "session": {"session_id": str(session_id), "turn": turn},
        }
        return store.TurnAdmission(
            session_id=session_id,
            turn=turn,
            request_id=request_id,
            # Whoever sent the message started the turn (four eyes reads it).
            run=admission(
                version,
                self._defaults,
                text,
                input_payload=payload,
                started_by=auth_context.label_or_none(),
                priority=priority,
            ),
        ), version


async def _unfinished(conn: Any, workspace_id: str, session_id: uuid.UUID) -> list[Any]:
    """The session's turns whose runs have not ended, oldest first (the running one and any
    enqueued after it)."""
    recent = await store.recent_turns(conn, workspace_id, session_id, MAX_HISTORY_TURNS)
    return [t for t in recent if t["status"] not in TERMINAL]


def _refuse(last: Any) -> None:
    raise Aborted(
        f"turn {last['turn']} (run {last['run_id']}) is still {last['status']}; "
        "send the next message after it ends"
    )


async def _cancel_turns(conn: Any, session: Any, turns: list[Any], how: str) -> list[uuid.UUID]:
    """Cancel the unfinished turns, newest first (so ending one wakes no parked turn), and
    record how each ended; the runs' executors are fenced at their next commit."""
    ws, session_id = session["workspace_id"], session["session_id"]
    reason = "interrupted by a new message" if how == INTERRUPT else "rolled back by a new message"
    cancelled = []
    for turn in reversed(turns):
        if (row := await run_store.cancel_run(conn, ws, turn["run_id"], reason)) is not None:
            run_figures.FIGURES.cancelled(row)
            await audit.record(
                conn, "run.cancelled", "run", str(turn["run_id"]), {"reason": reason}
            )
            cancelled.append(turn["run_id"])
            await store.mark_ended(conn, ws, session_id, turn["turn"], how)
    return cancelled


# --- gRPC -------------------------------------------------------------------------------------


def turn_message(row: Any) -> session_pb2.Turn:
    msg = session_pb2.Turn(
        turn=row["turn"],
        run_id=str(row["run_id"]),
        status=convert.STATUS_TO_PROTO[row["status"]],
        input=row["input"],
        output=row["output"] or "",
        error=row["error"] or "",
    )
    msg.create_time.CopyFrom(convert.timestamp(row["created_at"]))
    return msg


def session_message(
    row: Any, last_turn: Any, members: list[str] | None = None
) -> session_pb2.Session:
    msg = session_pb2.Session(
        workspace_id=row["workspace_id"],
        session_id=str(row["session_id"]),
        agent_id=row["agent_id"],
        title=row["title"],
        turn_count=row["turn_count"],
        strategy=STRATEGY_TO_PROTO[row["strategy"]],
        visibility=VISIBILITY_TO_PROTO[row["visibility"]],
        members=members if members is not None else row.get("members") or [],
    )
    if last_turn is not None:
        msg.last_turn.CopyFrom(turn_message(last_turn))
    msg.create_time.CopyFrom(convert.timestamp(row["created_at"]))
    msg.update_time.CopyFrom(convert.timestamp(row["updated_at"]))
    return msg


class SessionServicer(session_pb2_grpc.SessionServiceServicer):
    def __init__(self, conversations: Conversations) -> None:
        self._conversations = conversations

    async def CreateSession(
        self, request: session_pb2.CreateSessionRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.CreateSessionResponse:
        ws = auth_context.workspace(request.workspace_id)
        agent_id = validate.slug("agent_id", request.agent_id)
        title = validate.text("title", request.title, max_bytes=200)
        how = strategy("strategy", request.strategy) or REJECT
        seen_by = visibility("visibility", request.visibility) or privacy.WORKSPACE
        members = privacy.members("members", request.members)
        row, everyone = await self._conversations.create(ws, agent_id, title, how, seen_by, members)
        return session_pb2.CreateSessionResponse(session=session_message(row, None, everyone))

    async def GetSession(
        self, request: session_pb2.GetSessionRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.GetSessionResponse:
        ws = auth_context.workspace(request.workspace_id)
        session_id = validate.run_id("session_id", request.session_id)
        row, last = await self._conversations.get(ws, session_id)
        members = await self._conversations.members(ws, session_id)
        return session_pb2.GetSessionResponse(session=session_message(row, last, members))

    async def UpdateSessionMembers(
        self, request: session_pb2.UpdateSessionMembersRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.UpdateSessionMembersResponse:
        ws = auth_context.workspace(request.workspace_id)
        session_id = validate.run_id("session_id", request.session_id)
        add = privacy.members("add", request.add)
        remove = privacy.members("remove", request.remove)
        seen_by = visibility("visibility", request.visibility)
        row, last = await self._conversations.update_members(ws, session_id, add, remove, seen_by)
        members = await self._conversations.members(ws, session_id)
        return session_pb2.UpdateSessionMembersResponse(session=session_message(row, last, members))

    async def SendMessage(
        self, request: session_pb2.SendMessageRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.SendMessageResponse:
        ws = auth_context.workspace(request.workspace_id)
        session_id = validate.run_id("session_id", request.session_id)
        text = validate.text("text", request.text, max_bytes=MAX_INPUT_BYTES, required=True)
        request_id = validate.text("request_id", request.request_id, max_bytes=200) or None
        how = strategy("strategy", request.strategy)
        priority = validate.priority("priority", request.priority)
        row, created = await self._conversations.send(
            ws, session_id, text, request_id, how, priority
        )
        return session_pb2.SendMessageResponse(turn=turn_message(row), created=created)

    async def ListTurns(
        self, request: session_pb2.ListTurnsRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.ListTurnsResponse:
        ws = auth_context.workspace(request.workspace_id)
        session_id = validate.run_id("session_id", request.session_id)
        from_turn = max(validate.non_negative("from_turn", request.from_turn), 1)
        size = validate.in_range("page_size", request.page_size or 100, 1, 500)
        rows = await self._conversations.turns(ws, session_id, from_turn, size)
        next_turn = rows[-1]["turn"] + 1 if len(rows) == size else 0
        return session_pb2.ListTurnsResponse(
            turns=[turn_message(r) for r in rows], next_turn=next_turn
        )

    async def ListSessions(
        self, request: session_pb2.ListSessionsRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.ListSessionsResponse:
        ws = auth_context.workspace(request.workspace_id)
        size = validate.in_range("page_size", request.page_size or 50, 1, 500)
        agent_id = validate.slug("agent_id", request.agent_id) if request.agent_id else ""
        after = decode_page_token(request.page_token)
        rows = await self._conversations.page(ws, agent_id, after, size)
        token = ""
        if len(rows) == size:
            token = encode_page_token(rows[-1]["created_at"], rows[-1]["session_id"])
        return session_pb2.ListSessionsResponse(
            sessions=[session_message(r, None) for r in rows], next_page_token=token
        )
