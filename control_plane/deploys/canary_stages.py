"""The contract canary's stages, and which one a canary run stopped at and why (pure).

A canary is three runs on one release, one after the other: the contract run
(admitted → claimed on the release → the no-op tool started → its result → completed
with the marker), then a session turn and a fast-path turn, each a run of a one-turn
session that travels the same path. A failure names the first stage not reached and why,
in one "stage: reason" text that RunCanary's verdict, `agentrun canary` and the release's
recorded failure all carry. A turn's failure names the turn, then the stage inside it
("session turn: tool result: …").
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from control_plane.store.runs import Run
from control_plane.store.steps import Step

ADMITTED = "admitted"
TOOL_STARTED = "tool started"
TOOL_RESULT = "tool result"
COMPLETED = "completed with the marker"
SESSION_TURN = "session turn"
FAST_PATH_TURN = "fast-path turn"
TERMINAL = ("completed", "failed", "cancelled")

# Shared with executor/canary.py by value (the executor never imports the control plane).
TOOL = "canary_noop"
MARKER = "AGENTRUN-CANARY-OK/v1"


def claimed_on(release: str | None) -> str:
    """The claim's stage: on the release asked for, or on the newest."""
    return f"claimed on release {release}" if release else "claimed on the newest release"


@dataclass(frozen=True)
class Failed:
    """The stage a canary did not pass, and why."""

    stage: str
    reason: str

    def __str__(self) -> str:
        return f"{self.stage}: {self.reason}"

    def inside(self, turn: str) -> Failed:
        """This failure, of a run that was the canary's `turn` (a session or fast-path turn)."""
        return Failed(turn, str(self))


def marker(nonce: str) -> str:
    return f"{MARKER} {nonce}"


def _payload(step: Step) -> dict[str, Any]:
    value = json.loads(step.payload) if isinstance(step.payload, str) else step.payload
    return value if isinstance(value, dict) else {}


def _of_tool(steps: Sequence[Step], kind: str) -> list[Step]:
    return [s for s in steps if s.kind == kind and _payload(s).get("tool") == TOOL]


def settled(run: Run) -> bool:
    """Whether the canary has its answer: the run ended, or it parked (a canary run never
    waits for anything, so a park is the failure: a crash, a refusal, a limit)."""
    return run.status in TERMINAL or (run.status == "waiting" and run.lease_epoch > 0)


def _where(run: Run, steps: Sequence[Step], waited: float) -> str:
    """Where the run stands: how it ended, why it parked, or what it is after the wait."""
    if run.status in TERMINAL:
        return f"the run {run.status}: {run.error or 'no error recorded'}"
    if run.status == "waiting" and run.lease_epoch > 0:
        parks = [s for s in steps if s.kind == "park"]
        note = _payload(parks[-1]).get("note") if parks else None
        return f"the run parked ({run.wait_reason}): {note or 'no note recorded'}"
    return (
        f"after {waited:g}s the run is {run.status}, claimed {run.lease_epoch} time(s), "
        f"{run.step_count} step(s) admitted, last holder {run.lease_owner or 'none'}"
    )


def run_failure(
    run: Run, steps: Sequence[Step], nonce: str, release: str | None, waited: float
) -> Failed | None:
    """The first stage of the contract run that `run` (with its step log) did not reach;
    None when it passed: completed, its output exactly the marker with `nonce`."""
    claim = claimed_on(release)
    if run.lease_epoch == 0:
        return Failed(claim, f"no executor took it within {waited:g}s")
    if release is not None and run.release != release:
        return Failed(claim, f"it was claimed on release {run.release or '(none)'}")
    started = _of_tool(steps, "tool_started")
    if not started:
        return Failed(TOOL_STARTED, f"{TOOL} never started; {_where(run, steps, waited)}")
    results = _of_tool(steps, "tool_result")
    if not results:
        seq = started[0].seq
        return Failed(
            TOOL_RESULT, f"{TOOL} started (step {seq}), no result; {_where(run, steps, waited)}"
        )
    echo = f"canary-nonce:{nonce}"
    if not any((_payload(s).get("output") or {}).get("echo") == echo for s in results):
        return Failed(TOOL_RESULT, f"{TOOL}'s result does not echo the nonce")
    if run.status == "completed" and run.output == marker(nonce):
        return None
    if run.status == "completed":
        return Failed(COMPLETED, f"it completed without the marker: {run.output!r}")
    return Failed(COMPLETED, _where(run, steps, waited))
