"""Who sees a private session, its turns' runs and their events: the one place that decides
(issue 42 item 4, docs/sessions.md).

A *reader* is a principal's label as the log records it (`key:NAME`, `person:NAME`), or
None for one who sees everything: a workspace admin, or the platform's own work serving no
request. A private session is seen by its members and the workspace's admins only. Every
reader goes through here or through a query that takes the reader:

* lookups (`check_session`, `check_run`): GetSession, ListTurns, SendMessage,
  UpdateSessionMembers, GetRun, ListRunSteps, WatchRun and the run's other RPCs, and the
  `_agentrun/runs/...` and `_agentrun/sessions/...` streams answer NOT_FOUND (HTTP 404) for
  what the reader may not see: never PERMISSION_DENIED, which would tell that it exists;
* lists and the feed (sql: sessions_page, run_list_filter, feed_hidden): ListSessions,
  ListRuns and the workspace feed (`_agentrun/feed`, HTTP and gRPC ReadStream) leave it out
  inside the query, so a page is full whenever more visible rows follow and the feed's
  offsets stay those of its events.

Membership is read when the reader reads: adding a member shows them the session's past.
Every run below a turn (children at any depth, forks) is the session's too: its row names
the session from admission on (runs.session_id, migration 0053), so every check and list
filter is one predicate on the run's own row. The console's runs list and counts, ListRuns
of a run's forks and bulk actions' `matched` go through it as well.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from control_plane.auth import context
from control_plane.auth.principal import Capability, Kind, Principal
from control_plane.ground.errors import InvalidArgument, NotFound
from control_plane.store import privacy as store
from control_plane.store.db import Connection, Pool
from control_plane.store.steps import Step

WORKSPACE, PRIVATE = "workspace", "private"
MAX_MEMBERS = 100
MEMBER = re.compile(r"^(key|person):[^\x00-\x1f]{1,200}$")


def reader_of(who: Principal) -> str | None:
    """`who` as a reader: None (everything) for a workspace admin, else its label."""
    return None if who.may(Capability.ADMIN) else who.label


def reader() -> str | None:
    """The reader of the request being served (None outside one: the platform's own work)."""
    who = context.current_or_none()
    return None if who is None else reader_of(who)


def member_label() -> str | None:
    """The caller as a session member (a key or a person), or None (platform, executor, or
    no request being served)."""
    who = context.current_or_none()
    if who is None or who.kind not in (Kind.KEY, Kind.PERSON):
        return None
    return who.label


def members(field: str, values: Sequence[str]) -> list[str]:
    """Principals' labels, checked: INVALID_ARGUMENT naming `field` and the bad one."""
    if len(values) > MAX_MEMBERS:
        raise InvalidArgument(field, f"at most {MAX_MEMBERS} members at once")
    for value in values:
        if not MEMBER.match(value):
            raise InvalidArgument(
                field, f"{value[:60]!r} is not a principal: key:NAME or person:NAME"
            )
    return sorted(set(values))


async def check_session(
    pool: Pool | Connection, workspace_id: str, session_id: uuid.UUID, who: str | None
) -> None:
    """NOT_FOUND unless the session exists and `who` may see it."""
    hidden = await store.session_hidden(pool, workspace_id, session_id, who)
    if hidden is None or hidden:
        raise NotFound(f"session {session_id} not found")


async def check_run(
    pool: Pool | Connection, workspace_id: str, run_id: uuid.UUID, who: str | None
) -> None:
    """NOT_FOUND when the run is one `who` may not see (whether it exists is the caller's)."""
    if await store.run_hidden(pool, workspace_id, run_id, who):
        raise NotFound(f"run {run_id} not found")


# Role projections (issue 42 item 4, docs/streams.md "What each role sees"): what of a step
# a caller below operator (a reader, an approver) is shown. The executor's bookkeeping and
# the provider's raw words are left out; what the run did (content, calls and their
# arguments, results, waits, usage) stays. Fields by step kind:
INTERNAL_FIELDS: dict[str, frozenset[str]] = {
    # The provider's own ids and words: its response id, its stop reason, its refusal text.
    "model_decision": frozenset({"response_id", "stop_reason", "refusal"}),
    # The idempotency key the tool's provider deduplicates on.
    "tool_started": frozenset({"idempotency_key"}),
    # Which call never left, under which lease (the next holder's bookkeeping).
    "park": frozenset({"unsent_call_seq", "epoch"}),
}
# Internal steps: shown as their kind and span only (a summary's text is the model's recap
# of earlier steps, written for later prompts, with its own provider call's fields).
INTERNAL_KINDS: dict[str, frozenset[str]] = {
    "summary": frozenset({"from_seq", "through_seq", "turns"}),
}
# A tool call whose arguments were not valid JSON keeps the provider's raw text there.
RAW_CALL_FIELDS = frozenset({"arguments_raw"})


def sees_internals_of(who: Principal | None) -> bool:
    """Whether `who` sees every step whole: an operator or admin, an executor, a platform
    admin, or the platform's own work (None). A reader or an approver sees projections."""
    if who is None or who.kind in (Kind.EXECUTOR, Kind.PLATFORM):
        return True
    return who.may(Capability.OPERATE)


def sees_internals() -> bool:
    """sees_internals_of the caller of the request being served."""
    return sees_internals_of(context.current_or_none())


def project_payload(kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    """A step's payload as a caller below operator sees it (INTERNAL_FIELDS and friends)."""
    if kind in INTERNAL_KINDS:
        kept = {k: v for k, v in payload.items() if k in INTERNAL_KINDS[kind]}
        return {**kept, "redacted": True}
    hidden = INTERNAL_FIELDS.get(kind, frozenset())
    out = {k: v for k, v in payload.items() if k not in hidden}
    if kind == "model_decision" and isinstance(out.get("tool_calls"), list):
        out["tool_calls"] = [
            {k: v for k, v in c.items() if k not in RAW_CALL_FIELDS} if isinstance(c, dict) else c
            for c in out["tool_calls"]
        ]
    return out


def project_step(step: Step, internals: bool) -> Step:
    """The step as a caller sees it: whole when `internals` (sees_internals()), else its
    payload projected. Every door a step leaves by goes through here: ListRunSteps,
    WatchRun, the run and session streams (HTTP and gRPC) and the console's timeline."""
    if internals or (step.kind not in INTERNAL_FIELDS and step.kind not in INTERNAL_KINDS):
        return step
    try:
        payload = json.loads(step.payload)
    except ValueError:
        return replace(step, payload="{}")
    if not isinstance(payload, dict):
        return step
    projected = project_payload(step.kind, payload)
    return replace(step, payload=json.dumps(projected, ensure_ascii=False))
