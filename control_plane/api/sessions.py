"""Sessions: conversations with an agent, one turn (one run) at a time.

Sending a message admits the session's next run on the server, under the
session row's lock: if the previous turn's run has not ended, the send is
refused with ABORTED (HTTP 409) naming that turn, so two turns of one
conversation never run at once. The new run's input step carries the
transcript of the earlier turns (`history`: each user message and the answer
the agent gave), which the executor puts before the new message, so the
model sees the conversation so far. `Conversations` is the domain; the gRPC
servicer and the HTTP route are thin doors to it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from agentrun.v1 import session_pb2, session_pb2_grpc
from control_plane.api import convert, validate
from control_plane.api.runs import TERMINAL
from control_plane.auth import context as auth_context
from control_plane.config import RunDefaults
from control_plane.errors import Aborted, FailedPrecondition, NotFound
from control_plane.store import agents as agent_store
from control_plane.store import sessions as store
from control_plane.store.admission import MAX_INPUT_BYTES, admission
from control_plane.store.db import Pool, transaction

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

    def __init__(self, pool: Pool, defaults: RunDefaults, on_runnable: Callable[[], None]) -> None:
        self._pool = pool
        self._defaults = defaults
        self._on_runnable = on_runnable

    async def create(self, workspace_id: str, agent_id: str, title: str) -> Any:
        if await agent_store.get_agent(self._pool, workspace_id, agent_id) is None:
            raise NotFound(f"agent {agent_id!r} not found")
        return await store.create_session(self._pool, workspace_id, agent_id, title)

    async def get(self, workspace_id: str, session_id: uuid.UUID) -> tuple[Any, Any]:
        """The session and its latest turn (None before the first)."""
        row = await store.get_session(self._pool, workspace_id, session_id)
        if row is None:
            raise NotFound(f"session {session_id} not found")
        last = await store.recent_turns(self._pool, workspace_id, session_id, 1)
        return row, last[0] if last else None

    async def turns(
        self, workspace_id: str, session_id: uuid.UUID, from_turn: int, limit: int
    ) -> list[Any]:
        await self.get(workspace_id, session_id)
        return await store.list_turns(self._pool, workspace_id, session_id, from_turn, limit)

    async def send(
        self, workspace_id: str, session_id: uuid.UUID, text: str, request_id: str | None
    ) -> tuple[Any, bool]:
        """The turn this message started (and True), or the one its request_id started."""
        async with transaction(self._pool) as conn:
            session = await store.lock_session(conn, workspace_id, session_id)
            if session is None:
                raise NotFound(f"session {session_id} not found")
            if request_id:
                existing = await store.turn_by_request(conn, workspace_id, session_id, request_id)
                if existing is not None:
                    return existing, False
            earlier = await store.recent_turns(conn, workspace_id, session_id, MAX_HISTORY_TURNS)
            _check_no_turn_running(earlier)
            adm = await self._admission(conn, session, text, request_id, earlier)
            row = await store.admit_turn(conn, adm)
        self._on_runnable()
        return row, True

    async def _admission(
        self, conn: Any, session: Any, text: str, request_id: str | None, earlier: list[Any]
    ) -> store.TurnAdmission:
        ws, session_id = session["workspace_id"], session["session_id"]
        version = await agent_store.get_version(conn, ws, session["agent_id"], 0)
        if version is None:
            raise FailedPrecondition(f"agent {session['agent_id']!r} has no published version")
        turn = session["turn_count"] + 1
        payload = {
            "text": text,
            "history": transcript(earlier),
            "session": {"session_id": str(session_id), "turn": turn},
        }
        return store.TurnAdmission(
            session_id=session_id, turn=turn, request_id=request_id,
            # Whoever sent the message started the turn (four eyes reads it).
            run=admission(version, self._defaults, text, input_payload=payload,
                          started_by=auth_context.label_or_none()),
        )  # fmt: skip


def _check_no_turn_running(earlier: Sequence[Any]) -> None:
    if earlier and earlier[-1]["status"] not in TERMINAL:
        last = earlier[-1]
        raise Aborted(
            f"turn {last['turn']} (run {last['run_id']}) is still {last['status']}; "
            "send the next message after it ends"
        )


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


def session_message(row: Any, last_turn: Any) -> session_pb2.Session:
    msg = session_pb2.Session(
        workspace_id=row["workspace_id"],
        session_id=str(row["session_id"]),
        agent_id=row["agent_id"],
        title=row["title"],
        turn_count=row["turn_count"],
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
        row = await self._conversations.create(ws, agent_id, title)
        return session_pb2.CreateSessionResponse(session=session_message(row, None))

    async def GetSession(
        self, request: session_pb2.GetSessionRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.GetSessionResponse:
        ws = auth_context.workspace(request.workspace_id)
        session_id = validate.run_id("session_id", request.session_id)
        row, last = await self._conversations.get(ws, session_id)
        return session_pb2.GetSessionResponse(session=session_message(row, last))

    async def SendMessage(
        self, request: session_pb2.SendMessageRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.SendMessageResponse:
        ws = auth_context.workspace(request.workspace_id)
        session_id = validate.run_id("session_id", request.session_id)
        text = validate.text("text", request.text, max_bytes=MAX_INPUT_BYTES, required=True)
        request_id = validate.text("request_id", request.request_id, max_bytes=200) or None
        row, created = await self._conversations.send(ws, session_id, text, request_id)
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
