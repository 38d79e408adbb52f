"""The requests both clients send and how their answers become typed results: each method
returns a Call (service, method, request, converter) that Client and AsyncClient execute."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar, cast

from google.protobuf.message import Message

from agentrun.v1 import approval_pb2, run_pb2, session_pb2
from agentrun_client.errors import InvalidArgument
from agentrun_client.types import (
    Approval,
    Delta,
    Event,
    Page,
    Run,
    Session,
    Signal,
    Step,
    Turn,
    enum_value,
)

T = TypeVar("T")
MAX_PAGE = 500


@dataclass(frozen=True)
class Call(Generic[T]):
    service: str
    method: str
    request: Message
    convert: Callable[[Any], T]


def new_request_id() -> str:
    """A fresh dedupe key: a start retried after UNAVAILABLE must not admit a second run."""
    return f"py-{uuid.uuid4()}"


def _json_text(value: Any, what: str) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"{what}: not a JSON value ({exc})") from None


def _page_size(size: int) -> int:
    if not 1 <= size <= MAX_PAGE:
        raise InvalidArgument(f"page_size: must be between 1 and {MAX_PAGE}, got {size}")
    return size


def watch_event(event: run_pb2.WatchRunResponse) -> Step | Run | Delta:
    if event.HasField("step"):
        return Step.from_proto(event.step)
    if event.HasField("run"):
        return Run.from_proto(event.run)
    d = event.delta
    return Delta(seq=d.seq, index=d.index, epoch=d.epoch, text=d.text)


class Requests:
    """Request builders for one workspace."""

    def __init__(self, workspace: str) -> None:
        self.ws = workspace

    # --- runs ---------------------------------------------------------------------------------

    def start_run(
        self,
        agent: str,
        input: str,
        request_id: str | None,
        agent_version: int,
        priority: int,
        trigger_connection_id: str,
    ) -> Call[Run]:
        req = run_pb2.StartRunRequest(
            workspace_id=self.ws,
            agent_id=agent,
            input=input,
            agent_version=agent_version,
            request_id=request_id or new_request_id(),
            priority=priority,
            trigger_connection_id=trigger_connection_id,
        )
        return Call("runs", "StartRun", req, lambda r: Run.from_proto(r.run))

    def get_run(self, run_id: str) -> Call[Run]:
        req = run_pb2.GetRunRequest(workspace_id=self.ws, run_id=run_id)
        return Call("runs", "GetRun", req, lambda r: Run.from_proto(r.run))

    def cancel_run(self, run_id: str, reason: str) -> Call[Run]:
        req = run_pb2.CancelRunRequest(workspace_id=self.ws, run_id=run_id, reason=reason)
        return Call("runs", "CancelRun", req, lambda r: Run.from_proto(r.run))

    def fork_run(
        self, run_id: str, from_seq: int, agent_version: int, priority: int | None
    ) -> Call[Run]:
        req = run_pb2.ForkRunRequest(
            workspace_id=self.ws, run_id=run_id, from_seq=from_seq, agent_version=agent_version
        )
        if priority is not None:
            req.priority = priority
        return Call("runs", "ForkRun", req, lambda r: Run.from_proto(r.run))

    def signal_run(
        self, run_id: str, name: str, payload: Any, event_id: str | None
    ) -> Call[Signal]:
        req = run_pb2.SignalRunRequest(
            workspace_id=self.ws,
            run_id=run_id,
            signal_name=name,
            event_id=event_id or f"py-{uuid.uuid4()}",
            payload_json=_json_text(payload, "payload"),
        )
        return Call("runs", "SignalRun", req, lambda r: Signal.from_proto(r.signal, r.created))

    def publish_event(self, name: str, body: dict[str, Any], event_id: str | None) -> Call[Event]:
        if not isinstance(body, dict):
            raise InvalidArgument("body: must be a JSON object (a dict)")
        req = run_pb2.PublishEventRequest(
            workspace_id=self.ws,
            event_name=name,
            event_id=event_id or f"py-{uuid.uuid4()}",
            body_json=_json_text(body, "body"),
        )
        return Call("runs", "PublishEvent", req, lambda r: Event.from_proto(r.event, r.created))

    def resolve_unknown_outcome(
        self, run_id: str, seq: int, decision: str, decided_by: str, note: str
    ) -> Call[Run]:
        req = run_pb2.ResolveUnknownOutcomeRequest(
            workspace_id=self.ws,
            run_id=run_id,
            seq=seq,
            decision=cast(
                run_pb2.OutcomeDecision.ValueType,
                enum_value(run_pb2.OutcomeDecision, decision, "OUTCOME_DECISION_", "decision"),
            ),
            decided_by=decided_by,
            note=note,
        )
        return Call("runs", "ResolveUnknownOutcome", req, lambda r: Run.from_proto(r.run))

    def list_runs_page(
        self,
        page_token: str,
        page_size: int,
        agent: str | None,
        status: str | None,
        since: datetime | None,
        search: str | None,
        forked_from: str | None,
    ) -> Call[Page[Run]]:
        req = run_pb2.ListRunsRequest(
            workspace_id=self.ws,
            page_size=_page_size(page_size),
            page_token=page_token,
            agent_id=agent or "",
            search=search or "",
            forked_from_run_id=forked_from or "",
        )
        if status:
            req.status = enum_value(run_pb2.RunStatus, status, "RUN_STATUS_", "status")  # type: ignore[assignment]
        if since is not None:
            req.create_after.FromDatetime(since)
        return Call(
            "runs",
            "ListRuns",
            req,
            lambda r: Page(tuple(Run.from_proto(m) for m in r.runs), r.next_page_token),
        )

    def list_steps_page(self, run_id: str, from_seq: int, page_size: int) -> Call[Page[Step]]:
        """A page of steps; its token is the next seq as text ("" when nothing more now)."""
        req = run_pb2.ListRunStepsRequest(
            workspace_id=self.ws, run_id=run_id, from_seq=from_seq, page_size=page_size
        )

        def convert(r: run_pb2.ListRunStepsResponse) -> Page[Step]:
            more = bool(r.steps) and r.next_seq > from_seq
            steps = tuple(Step.from_proto(m) for m in r.steps)
            return Page(steps, str(r.next_seq) if more else "")

        return Call("runs", "ListRunSteps", req, convert)

    def watch(self, run_id: str, from_seq: int, deltas: bool) -> run_pb2.WatchRunRequest:
        return run_pb2.WatchRunRequest(
            workspace_id=self.ws, run_id=run_id, from_seq=from_seq, deltas=deltas
        )

    # --- approvals ----------------------------------------------------------------------------

    def list_approvals_page(
        self, page_token: str, page_size: int, state: str | None, approver: str | None
    ) -> Call[Page[Approval]]:
        req = approval_pb2.ListApprovalsRequest(
            workspace_id=self.ws,
            page_size=_page_size(page_size),
            page_token=page_token,
            approver=approver or "",
        )
        if state:
            req.state = enum_value(approval_pb2.ApprovalState, state, "APPROVAL_STATE_", "state")  # type: ignore[assignment]
        return Call(
            "approvals",
            "ListApprovals",
            req,
            lambda r: Page(tuple(Approval.from_proto(m) for m in r.approvals), r.next_page_token),
        )

    def get_approval(self, approval_id: str) -> Call[Approval]:
        req = approval_pb2.GetApprovalRequest(workspace_id=self.ws, approval_id=approval_id)
        return Call("approvals", "GetApproval", req, lambda r: Approval.from_proto(r.approval))

    def decide(
        self,
        approval_id: str,
        approve: bool,
        reason: str = "",
        arguments: Any = None,
        note: str = "",
    ) -> Call[Approval]:
        req = approval_pb2.DecideApprovalRequest(workspace_id=self.ws, approval_id=approval_id)
        if not approve:
            req.reject.reason = reason
        elif arguments is not None:
            req.edit.arguments_json = _json_text(arguments, "arguments")
            req.edit.note = note
        else:
            req.approve.SetInParent()
        return Call("approvals", "DecideApproval", req, lambda r: Approval.from_proto(r.approval))

    # --- sessions -----------------------------------------------------------------------------

    def create_session(self, agent: str, title: str, strategy: str | None) -> Call[Session]:
        req = session_pb2.CreateSessionRequest(workspace_id=self.ws, agent_id=agent, title=title)
        if strategy:
            req.strategy = _strategy(strategy)  # type: ignore[assignment]
        return Call("sessions", "CreateSession", req, lambda r: Session.from_proto(r.session))

    def send_message(
        self,
        session_id: str,
        text: str,
        request_id: str | None,
        strategy: str | None,
        priority: int,
    ) -> Call[Turn]:
        req = session_pb2.SendMessageRequest(
            workspace_id=self.ws,
            session_id=session_id,
            text=text,
            request_id=request_id or new_request_id(),
            priority=priority,
        )
        if strategy:
            req.strategy = _strategy(strategy)  # type: ignore[assignment]
        return Call("sessions", "SendMessage", req, lambda r: Turn.from_proto(r.turn, r.created))


def _strategy(name: str) -> int:
    return enum_value(session_pb2.SessionStrategy, name, "SESSION_STRATEGY_", "strategy")
