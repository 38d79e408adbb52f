"""Typed results: frozen dataclasses, JSON decoded to Python values, enums as str enums,
times as aware datetimes (None when unset). Each keeps its protobuf message as `proto`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Generic, TypeVar

from google.protobuf import duration_pb2, timestamp_pb2
from google.protobuf.message import Message

from agentrun.v1 import approval_pb2, run_pb2, session_pb2
from agentrun_client.errors import InvalidArgument

T = TypeVar("T")


class RunStatus(StrEnum):
    UNSPECIFIED = "unspecified"
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


class StepKind(StrEnum):
    UNSPECIFIED = "unspecified"
    INPUT = "input"
    MODEL_DECISION = "model_decision"
    TOOL_STARTED = "tool_started"
    TOOL_RESULT = "tool_result"
    PARK = "park"
    FINISH = "finish"
    APPROVAL_REQUESTED = "approval_requested"
    APPROVAL_DECIDED = "approval_decided"
    SUMMARY = "summary"
    FORKED = "forked"


class ApprovalState(StrEnum):
    UNSPECIFIED = "unspecified"
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EDITED = "edited"
    EXPIRED = "expired"
    CLOSED = "closed"


class OutcomeDecision(StrEnum):
    """What a person says about a tool call whose outcome is unknown."""

    HAPPENED = "happened"
    NOT_HAPPENED = "not_happened"
    RETRY = "retry"
    FAIL_RUN = "fail_run"


class SessionStrategy(StrEnum):
    """What a message sent while the previous turn runs does."""

    UNSPECIFIED = "unspecified"
    REJECT = "reject"
    ENQUEUE = "enqueue"
    INTERRUPT = "interrupt"
    ROLLBACK = "rollback"


def enum_name(proto_enum: Any, value: int, prefix: str) -> str:
    """RUN_STATUS_WAITING -> "waiting"."""
    return str(proto_enum.Name(value)).removeprefix(prefix).lower()


def enum_value(proto_enum: Any, name: str, prefix: str, what: str) -> int:
    """ "waiting" -> RUN_STATUS_WAITING; InvalidArgument naming `what` for an unknown name."""
    try:
        return int(proto_enum.Value(prefix + str(name).upper()))
    except ValueError:
        known = [n.removeprefix(prefix).lower() for n in proto_enum.keys()[1:]]
        raise InvalidArgument(
            f"{what}: unknown value {name!r}; one of {', '.join(known)}"
        ) from None


def _time(msg: Message, name: str) -> datetime | None:
    if not msg.HasField(name):
        return None
    stamp: timestamp_pb2.Timestamp = getattr(msg, name)
    return stamp.ToDatetime(tzinfo=UTC)


def _duration(msg: Message, name: str) -> timedelta | None:
    if not msg.HasField(name):
        return None
    value: duration_pb2.Duration = getattr(msg, name)
    return value.ToTimedelta()


def _json(text: str) -> Any:
    """A JSON field's value; an empty field is None."""
    return json.loads(text) if text else None


@dataclass(frozen=True)
class Counters:
    steps: int
    model_calls: int
    tool_calls: int
    tokens: int
    input_tokens: int
    output_tokens: int
    cost_micros: int


@dataclass(frozen=True)
class Run:
    """One execution of an agent version. `input` and `output` are the run's text."""

    run_id: str
    workspace_id: str
    agent_id: str
    agent_version: int
    status: RunStatus
    wait_reason: str
    input: str
    output: str
    error: str
    priority: int
    attempt: int
    counters: Counters
    create_time: datetime | None
    update_time: datetime | None
    finish_time: datetime | None
    wake_time: datetime | None
    active_duration: timedelta | None
    parent_run_id: str
    forked_from_run_id: str
    forked_from_seq: int
    child_run_ids: tuple[str, ...]
    release: str
    proto: run_pb2.Run = field(repr=False, compare=False)

    @property
    def done(self) -> bool:
        return self.status.terminal

    @classmethod
    def from_proto(cls, msg: run_pb2.Run) -> Run:
        c = msg.counters
        return cls(
            run_id=msg.run_id,
            workspace_id=msg.workspace_id,
            agent_id=msg.agent_id,
            agent_version=msg.agent_version,
            status=RunStatus(enum_name(run_pb2.RunStatus, msg.status, "RUN_STATUS_")),
            wait_reason=msg.wait_reason,
            input=msg.input,
            output=msg.output,
            error=msg.error,
            priority=msg.priority,
            attempt=msg.attempt,
            counters=Counters(
                steps=c.steps,
                model_calls=c.model_calls,
                tool_calls=c.tool_calls,
                tokens=c.tokens,
                input_tokens=c.input_tokens,
                output_tokens=c.output_tokens,
                cost_micros=c.cost_micros,
            ),
            create_time=_time(msg, "create_time"),
            update_time=_time(msg, "update_time"),
            finish_time=_time(msg, "finish_time"),
            wake_time=_time(msg, "wake_time"),
            active_duration=_duration(msg, "active_duration"),
            parent_run_id=msg.parent_run_id,
            forked_from_run_id=msg.forked_from_run_id,
            forked_from_seq=msg.forked_from_seq,
            child_run_ids=tuple(msg.child_run_ids),
            release=msg.release,
            proto=msg,
        )


@dataclass(frozen=True)
class Step:
    """One entry of a run's log; `payload` is the decoded JSON (its shape depends on `kind`,
    docs/protocol.md)."""

    run_id: str
    seq: int
    kind: StepKind
    payload: Any
    ref_seq: int
    epoch: int
    create_time: datetime | None
    release: str
    proto: run_pb2.Step = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, msg: run_pb2.Step) -> Step:
        return cls(
            run_id=msg.run_id,
            seq=msg.seq,
            kind=StepKind(enum_name(run_pb2.StepKind, msg.kind, "STEP_KIND_")),
            payload=_json(msg.payload_json),
            ref_seq=msg.ref_seq,
            epoch=msg.epoch,
            create_time=_time(msg, "create_time"),
            release=msg.release,
            proto=msg,
        )


@dataclass(frozen=True)
class Delta:
    """Model output while it is generated (watch(..., deltas=True)); best-effort."""

    seq: int
    index: int
    epoch: int
    text: str


@dataclass(frozen=True)
class Approval:
    approval_id: str
    run_id: str
    tool: str
    state: ApprovalState
    arguments: Any
    arguments_sha256: str
    approvers: tuple[str, ...]
    decided_by: str
    reason: str
    edited_arguments: Any
    high_risk: bool
    moves_money: bool
    create_time: datetime | None
    expire_time: datetime | None
    decide_time: datetime | None
    proto: approval_pb2.Approval = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, msg: approval_pb2.Approval) -> Approval:
        return cls(
            approval_id=msg.approval_id,
            run_id=msg.run_id,
            tool=msg.tool,
            state=ApprovalState(
                enum_name(approval_pb2.ApprovalState, msg.state, "APPROVAL_STATE_")
            ),
            arguments=_json(msg.arguments_json),
            arguments_sha256=msg.arguments_sha256,
            approvers=tuple(msg.approvers),
            decided_by=msg.decided_by,
            reason=msg.reason,
            edited_arguments=_json(msg.edited_arguments_json),
            high_risk=msg.high_risk,
            moves_money=msg.moves_money,
            create_time=_time(msg, "create_time"),
            expire_time=_time(msg, "expire_time"),
            decide_time=_time(msg, "decide_time"),
            proto=msg,
        )


@dataclass(frozen=True)
class Signal:
    run_id: str
    event_id: str
    name: str
    payload: Any
    sent_by: str
    created: bool
    """False when the event id was used already (this is the first signal)."""
    proto: run_pb2.Signal = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, msg: run_pb2.Signal, created: bool) -> Signal:
        return cls(
            run_id=msg.run_id,
            event_id=msg.event_id,
            name=msg.signal_name,
            payload=_json(msg.payload_json),
            sent_by=msg.sent_by,
            created=created,
            proto=msg,
        )


@dataclass(frozen=True)
class Event:
    """A published event (RunService.PublishEvent) and what it did when it was published."""

    event_id: str
    name: str
    body: Any
    published_by: str
    woke: int
    """The runs whose wait_for_event call it ended."""
    cancelled: int
    """The runs it cancelled (their agent version's cancel_on)."""
    created: bool
    """False when the event id was used already (this is the first event; nothing was
    woken again)."""
    proto: run_pb2.Event = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, msg: run_pb2.Event, created: bool) -> Event:
        return cls(
            event_id=msg.event_id,
            name=msg.event_name,
            body=_json(msg.body_json),
            published_by=msg.published_by,
            woke=msg.woke,
            cancelled=msg.cancelled,
            created=created,
            proto=msg,
        )


@dataclass(frozen=True)
class Turn:
    """One message of a session and the run that answers it."""

    turn: int
    run_id: str
    status: RunStatus
    input: str
    output: str
    error: str
    created: bool
    proto: session_pb2.Turn = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, msg: session_pb2.Turn, created: bool = True) -> Turn:
        return cls(
            turn=msg.turn,
            run_id=msg.run_id,
            status=RunStatus(enum_name(run_pb2.RunStatus, msg.status, "RUN_STATUS_")),
            input=msg.input,
            output=msg.output,
            error=msg.error,
            created=created,
            proto=msg,
        )


@dataclass(frozen=True)
class Session:
    session_id: str
    agent_id: str
    title: str
    turn_count: int
    strategy: SessionStrategy
    create_time: datetime | None
    proto: session_pb2.Session = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, msg: session_pb2.Session) -> Session:
        return cls(
            session_id=msg.session_id,
            agent_id=msg.agent_id,
            title=msg.title,
            turn_count=msg.turn_count,
            strategy=SessionStrategy(
                enum_name(session_pb2.SessionStrategy, msg.strategy, "SESSION_STRATEGY_")
            ),
            create_time=_time(msg, "create_time"),
            proto=msg,
        )


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a listing; `next_page_token` is empty on the last page."""

    items: tuple[T, ...]
    next_page_token: str
