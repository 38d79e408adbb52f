"""An unknown outcome asks a person, in the park's own transaction (issue 43).

When a tool call's outcome is unknown and nothing may settle it (class `none`, or
retries exhausted), the executor commits the `unknown` tool_result with a park for
`human`. The same transaction (UnknownOutcomePark, an effect of the commit pipeline)
records the question (`unknown_questions`) and one outbox row per person asked: so a
crash between the park and the send still sends, and a person is told exactly once per
park. The notification carries the exact call (tool, arguments), its idempotency key,
its class and what the platform already tried.

Who is asked follows the agent version's `unknown_outcome` policy:

* `ask`: `approvers` (the approval policy's approvers, else the workspace's admins),
  `starter` (the person who started the run), or any address (a person or a group's
  list); default `["approvers"]`;
* `slack`: Slack users whose buttons answer (default: the approval policy's
  `slack_approvers`); one message goes to `slack_channel` (default `#approvals`);
* `every_seconds` (default a day), `on_timeout` (`remind`, `escalate`, `fail`),
  `escalate_to`, `max_reminders` (default 2): the policy loop (expire_once, on the
  database clock) reminds, escalates once, and when nothing is left fails the run.

The answer is the step RunService.ResolveUnknownOutcome appends (the console's button,
`agentrun runs resolve`, or a Slack button), with the authenticated principal; the
first answer closes the question and a second is refused naming the first.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agentrun.v1 import executor_pb2 as pb
from control_plane.approvals.policy import FALLBACK_APPROVER
from control_plane.dispatch.pipeline import Work
from control_plane.store import approvals as approval_store
from control_plane.store import outbox, questions
from control_plane.store import steps as step_store
from control_plane.store.db import Connection, Pool, transaction
from control_plane.store.queries import run as run_query

log = logging.getLogger(__name__)

WAIT_REASON = "human"
KIND = "unknown_outcome"
REMINDER, ESCALATION = "unknown_outcome_reminder", "unknown_outcome_escalation"
KINDS = (KIND, REMINDER, ESCALATION)
DEFAULT_EVERY_SECONDS = 24 * 3600
DEFAULT_MAX_REMINDERS = 2
ON_TIMEOUT = ("remind", "escalate", "fail")
BATCH = 50
ANSWERS = ("happened", "not_happened", "retry", "fail_run")


@dataclass(frozen=True)
class Unknown:
    """The unknown tool_result a commit records: its seq and payload."""

    seq: int
    call_seq: int  # the tool_started it answers
    payload: dict[str, Any]


def unknown_in(req: step_store.CommitRequest) -> Unknown | None:
    """The unknown outcome this commit parks on, if any (a held repeat is needs_help's)."""
    if req.transition.status != "waiting" or req.transition.wait_reason != WAIT_REASON:
        return None
    for step in req.steps:
        if step.kind != "tool_result":
            continue
        payload = json.loads(step.payload_json or "{}")
        if (
            isinstance(payload, dict)
            and payload.get("status") == "unknown"
            and payload.get("awaiting") == "human"
        ):
            return Unknown(step.seq, step.ref_seq or 0, payload)
    return None


def _people(pol: dict[str, Any], approval: dict[str, Any], starter: str | None) -> list[str]:
    asked: list[str] = []
    for who in pol.get("ask") or ["approvers"]:
        if who == "approvers":
            asked += list(approval.get("approvers") or [FALLBACK_APPROVER])
        elif who == "starter":
            if starter and starter.startswith("person:"):
                asked.append(starter.split(":", 1)[1])
        elif isinstance(who, str) and who:
            asked.append(who)
    return list(dict.fromkeys(asked)) or [FALLBACK_APPROVER]


def question_for(
    spec: dict[str, Any] | None,
    starter: str | None,
    workspace_id: str,
    run_id: Any,
    unknown: Unknown,
    call: dict[str, Any],
) -> questions.NewQuestion:
    """The question this unknown outcome asks, with the agent version's policy copied."""
    approval = (spec or {}).get("approval") or {}
    pol = (spec or {}).get("unknown_outcome") or {}
    on_timeout = str(pol.get("on_timeout") or "remind")
    if on_timeout not in ON_TIMEOUT:
        on_timeout = "remind"
    return questions.NewQuestion(
        workspace_id=workspace_id,
        run_id=run_id,
        seq=unknown.seq,
        tool=str(unknown.payload.get("tool") or "?"),
        recipients=_people(pol, approval, starter),
        slack_recipients=list(pol.get("slack") or approval.get("slack_approvers") or []),
        every_seconds=int(pol.get("every_seconds") or DEFAULT_EVERY_SECONDS),
        on_timeout=on_timeout,
        escalate_to=list(pol.get("escalate_to") or []),
        max_reminders=int(pol.get("max_reminders", DEFAULT_MAX_REMINDERS)),
        call=call,
    )


def summary(q: questions.NewQuestion | questions.Question) -> dict[str, Any]:
    """What every notification of the question carries: the exact call and what was tried."""
    call = q.call
    return {
        "run_id": str(q.run_id),
        "seq": q.seq,
        "tool": q.tool,
        "arguments": call.get("arguments"),
        "idempotency_key": call.get("idempotency_key"),
        "class": call.get("class"),
        "tried": call.get("tried"),
    }


def notifications(
    q: questions.NewQuestion | questions.Question,
    kind: str,
    chat_channel: str = "#approvals",
) -> list[outbox.Notification]:
    """One mail per person asked; one chat post (with answer buttons) when Slack users answer."""
    body = {"kind": kind, **summary(q)}
    notes = [outbox.Notification(q.workspace_id, kind, "mail", who, body) for who in q.recipients]
    if q.slack_recipients:
        notes.append(outbox.Notification(q.workspace_id, kind, "chat", chat_channel, body))
    return notes


class UnknownOutcomePark:
    """The effect of a park for WAIT_REASON (registered in control_plane/server.py)."""

    async def prepare(self, db: Pool, req: step_store.CommitRequest, msg: pb.Commit) -> Work | None:
        unknown = unknown_in(req)
        if unknown is None:
            return None
        ws, run_id = req.workspace_id, req.run_id
        spec = await approval_store.run_spec(db, ws, run_id)
        guard = await approval_store.run_guard(db, ws, run_id)
        call = await _call(db, req, unknown)
        q = question_for(spec, guard.started_by, ws, run_id, unknown, call)
        channel = ((spec or {}).get("unknown_outcome") or {}).get("slack_channel") or "#approvals"
        notes = notifications(q, KIND, channel)
        return Work(functools.partial(_ask, q, notes))


async def _call(db: Any, req: step_store.CommitRequest, unknown: Unknown) -> dict[str, Any]:
    """The exact call (its tool_started step: committed before the call left, or in this
    commit) and what was tried (the unknown result)."""
    here = [s.payload_json for s in req.steps if s.seq == unknown.call_seq]
    if here:
        payload = json.loads(here[0] or "{}")
    else:
        started = await run_query(
            db, "unknown_step_get", req.workspace_id, req.run_id, unknown.call_seq
        )
        payload = json.loads(started["payload"]) if started else {}
    tried = unknown.payload.get("resolution") or unknown.payload.get("error") or ""
    return {
        "arguments": payload.get("arguments"),
        "idempotency_key": payload.get("idempotency_key"),
        "class": payload.get("class"),
        "tried": str(tried)[:2000],
    }


async def _ask(
    q: questions.NewQuestion, notes: list[outbox.Notification], conn: Connection
) -> bool:
    if await questions.insert(conn, q) is None:
        return False  # this park asked already (a commit resent after it landed)
    for note in notes:
        await outbox.insert(conn, note)
    return False


def next_action(q: questions.Question) -> str:
    """What a due question does: the policy's step while it has rounds left, else fail."""
    if q.on_timeout == "escalate" and q.escalation_level == 0 and q.escalate_to:
        return "escalate"
    if q.on_timeout != "fail" and q.reminders_sent < q.max_reminders:
        return "remind"
    return "fail"


async def _apply(conn: Connection, q: questions.Question, now: datetime | None) -> str:
    action = next_action(q)
    if action == "fail":
        why = f"nobody answered the unknown outcome of {q.tool} (step {q.seq})"
        if not await questions.fail_run(conn, q, why, now):
            await questions.close(conn, q.workspace_id, q.run_id, q.seq, "run no longer waits")
        return action
    escalate = action == "escalate"
    new = await questions.advance(
        conn, q, recipients=list(q.escalate_to) if escalate else None, escalate=escalate, now=now
    )
    assert new is not None  # locked above and still open
    for note in notifications(new, ESCALATION if escalate else REMINDER):
        await outbox.insert(conn, note)
    return action


async def expire_once(pool: Pool, now: datetime | None = None) -> list[str]:
    """Apply the policy to up to BATCH open questions whose next action is due; a
    transaction per workspace (one shard on Citus), the longest overdue first."""
    actions: list[str] = []
    for ws in await questions.due_workspaces(pool, BATCH, now):
        async with transaction(pool) as conn:
            for q in await questions.lock_due(conn, ws, BATCH, now):
                actions.append(await _apply(conn, q, now))
    return actions


async def run_forever(pool: Pool, interval: float) -> None:
    """The policy loop of one replica (replicas skip each other's locked rows)."""
    while True:
        try:
            await expire_once(pool)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the database may be restarting
            log.warning("unknown-outcome policy failed, retrying: %s", exc)
        await asyncio.sleep(interval)


_VERB = {REMINDER: "Reminder: ", ESCALATION: "Escalated: "}


def _text(payload: dict[str, Any]) -> str:
    arguments = json.dumps(payload.get("arguments"), sort_keys=True)
    return (
        f"{_VERB.get(payload['kind'], '')}agent run {payload['run_id']} called "
        f"{payload['tool']} with {arguments} and nobody knows whether it happened. "
        f"Idempotency key {payload.get('idempotency_key')}, class {payload.get('class')}; "
        f"tried: {payload.get('tried') or 'nothing (it may not be retried)'}."
    )


def request(row: Any) -> tuple[str, dict[str, Any]]:
    """The relay's request for a question's notification: a mail, or a chat post whose
    buttons answer it (http/approvals.py, the Slack interaction route)."""
    payload = json.loads(row["payload"])
    nid = str(row["notification_id"])
    text = _text(payload)
    if row["channel"] == "mail":
        body = (
            f"{text}\n\nAnswer on step {payload['seq']}: agentrun runs resolve "
            f"{payload['run_id']} {payload['seq']} happened|not_happened|retry|fail_run "
            f"(or in the console).\n\nnotification {nid}"
        )
        subject = f"Did it happen? {payload['tool']} (agent run {payload['run_id']})"
        return "/mail/send", {"to": row["recipient"], "subject": subject, "body": body}
    value = f"{row['workspace_id']}:{payload['run_id']}:{payload['seq']}"
    return "/chat/messages", {
        "channel": row["recipient"],
        "text": text,
        "notification_id": nid,
        "actions": [{"action_id": a, "value": value} for a in ANSWERS],
    }
