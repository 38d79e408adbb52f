"""What a run copies when it is admitted, decided in one place for every door.

StartRun, a trigger event and a session turn each admit a run; all three build
an `Admission` here (from the agent version, the server's defaults and who
started it) and insert it with the one SQL shape `run_admit` (sql/runs.sql),
which the statements of the three doors include. What a run is held to —
steps, tokens, tool calls, active-time deadline, model retries, maximum age, the
context threshold — is fixed at admission: publishing a new version never
changes a run under way.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from control_plane.ground.config import RunDefaults

# A run's input text, at most (trigger sources clip to it, StartRun refuses more).
MAX_INPUT_BYTES = 256 * 1024
# A run's priority (0026_run_priority.sql checks the same range); 0 is the default.
PRIORITY_MIN, PRIORITY_MAX = -100, 100


@dataclass(frozen=True)
class Admission:
    """Everything copied onto a run when it is admitted."""

    workspace_id: str
    agent_id: str
    agent_version: int
    input: str
    request_id: str | None  # StartRun's dedupe key (a turn's is on the turn)
    max_steps: int
    max_tokens: int
    max_tool_calls: int
    deadline_seconds: int  # of active time (held by executors)
    model_retry_budget: int = 30
    max_age_seconds: int = 0  # of the run as a whole; 0 = none
    repeat_limit: int = 3  # identical tool calls before the run waits for a person
    context_tokens: int = 0  # prompt size (estimated tokens) past which steps are summarised
    # The label of the principal who started the run (`key:ci-bot`, `person:ada@…`).
    started_by: str | None = None
    # The input step (seq 0); None: just {"text": input}. Its `text` is the run's input.
    input_payload: dict[str, Any] | None = None
    # Higher goes first within the workspace's fair share (PRIORITY_MIN..PRIORITY_MAX).
    priority: int = 0
    run_id: uuid.UUID = field(default_factory=uuid.uuid4)
    # Tags and metadata (a JSON object's text), checked by ground/run_labels.py; None: none.
    tags: list[str] | None = None
    metadata: str | None = None
    # The session whose turn this is (migration 0053); children and forks take theirs
    # from their parent or source when marked.
    session_id: uuid.UUID | None = None
    # The concurrency_key rule (stored JSON text, as an agent version's spec keeps it) of
    # the trigger starting the run, read instead of its version's (0054); None: the
    # version's.
    key_rule: str | None = None

    def params(self, now: datetime | None) -> dict[str, Any]:
        """The named parameters of the `run_admit` fragment."""
        payload = self.input_payload if self.input_payload is not None else {"text": self.input}
        assert payload.get("text") == self.input, "the input step carries the run's input"
        return {
            "workspace_id": self.workspace_id,
            "run_id": self.run_id,
            "agent_id": self.agent_id,
            "agent_version": self.agent_version,
            "request_id": self.request_id,
            "input_payload": json.dumps(payload),
            "max_steps": self.max_steps,
            "max_tokens": self.max_tokens,
            "max_tool_calls": self.max_tool_calls,
            "deadline_seconds": self.deadline_seconds,
            "max_age_seconds": self.max_age_seconds,
            "repeat_limit": self.repeat_limit,
            "context_tokens": self.context_tokens,
            "model_retry_budget": self.model_retry_budget,
            "started_by": self.started_by,
            "priority": self.priority,
            "tags": self.tags,
            "metadata": self.metadata,
            "session_id": self.session_id,
            "key_rule": self.key_rule,
            "now": now,
        }


def admission(
    version: Any,
    defaults: RunDefaults,
    input: str,
    *,
    started_by: str | None = None,
    request_id: str | None = None,
    input_payload: dict[str, Any] | None = None,
    priority: int = 0,
    tags: list[str] | None = None,
    metadata: str | None = None,
    key_rule: dict[str, Any] | None = None,
) -> Admission:
    """The admission of a run of `version` (an agent version row): its limits, with the
    server's defaults for those it leaves unset (max age: none); `key_rule`: a trigger's
    concurrency_key rule (as stored), overriding the version's for this run."""
    limits = json.loads(version["spec"]).get("limits", {})
    return Admission(
        workspace_id=version["workspace_id"],
        agent_id=version["agent_id"],
        agent_version=version["version"],
        input=input,
        request_id=request_id,
        max_steps=limits.get("max_steps") or defaults.max_steps,
        max_tokens=limits.get("max_tokens") or defaults.max_tokens,
        max_tool_calls=limits.get("max_tool_calls") or defaults.max_tool_calls,
        deadline_seconds=limits.get("deadline_seconds") or defaults.deadline_seconds,
        model_retry_budget=limits.get("model_retry_budget") or defaults.model_retry_budget,
        max_age_seconds=limits.get("max_age_seconds") or 0,
        repeat_limit=limits.get("repeat_limit") or defaults.repeat_limit,
        context_tokens=limits.get("context_tokens") or 0,
        started_by=started_by,
        input_payload=input_payload,
        priority=priority,
        tags=tags,
        metadata=metadata,
        key_rule=json.dumps(key_rule) if key_rule else None,
    )
