"""The contract canary (issues 15, 41): a deploy's proof that the whole run path works.

A liveness check is not enough: a mixed-version failure in the execution
fence passes every health check, because an empty queue looks healthy. So a
release is canaried: by itself when one of its executors connects (the
self-check, deploys/self_check.py) and whenever an operator runs `agentrun
canary` (CanaryService.RunCanary). It works in an internal workspace
(`agentrun-internal-canary`, a reserved name, created on the first canary; no
customer key belongs to it), so it shows in no customer's lists and counts
against no customer's caps or credits.

A canary is three runs on one release, one after the other (the stages are
named in deploys/canary_stages.py):

1. the contract run, admitted on the release asked for (or left to the newest):
   the claim, the claim-time context, the executor boundary, fence admission of
   each commit, the built-in no-op tool's start and result commits, normal
   completion;
2. a session turn: a message sent to a new session of the canary agent, admitted
   as SendMessage admits it, on the release the contract run was claimed on;
3. a fast-path turn: the same with the fast-path canary agent, whose turn is
   leased in the admission's transaction to a stream of that release on this
   replica when one has a free slot (else the claim takes it, and the verdict
   says so).

The executor answers each with a fixed protocol marker in place of the model
(executor/canary.py): no model is called and no provider is touched. Only runs
that complete with exactly the marker and their own nonce pass; the first stage
a canary does not reach fails it, within its time (default 10 s for all three),
and its verdict names that stage and why. The outcome is recorded on the
release: its pass time, or its failure time with the stage and reason; a
release whose last canary failed takes no new runs while the gate is on
(AGENTRUN_RELEASE_GATE, on by default). A canary run left unfinished by a
failure is cancelled, so it holds no slot of the release after its verdict.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import grpc

from agentrun.v1 import release_pb2, release_pb2_grpc
from control_plane.api.sessions import INTERRUPT, Conversations
from control_plane.auth import context as auth_context
from control_plane.deploys import canary_stages as stages
from control_plane.deploys.canary_stages import MARKER, TOOL, Failed
from control_plane.deploys.releases import newest_of, release_name
from control_plane.dispatch.fast_path import FastPath
from control_plane.dispatch.slots import live_seconds
from control_plane.ground import convert
from control_plane.ground.errors import InvalidArgument
from control_plane.ops import run_figures
from control_plane.store import agents as agent_store
from control_plane.store import canary as canary_store
from control_plane.store import releases as release_store
from control_plane.store import runs as run_store
from control_plane.store import steps as step_store
from control_plane.store.admission import admission
from control_plane.store.db import Pool
from control_plane.store.runs import Run

if TYPE_CHECKING:
    from control_plane.dispatch.dispatcher import Dispatcher

# Shared with executor/canary.py by value (the executor never imports the control plane).
CANARY_WORKSPACE = "agentrun-internal-canary"
CANARY_AGENT = "canary"
CANARY_FAST_AGENT = "canary-fast"
CANARY_TOOL = TOOL
# A finished canary run is the verdict of one deploy step and nobody's data: the retention
# loop (control_plane/runs/retention.py) deletes it this long after it finished.
CANARY_KEEP = timedelta(hours=1)
SPEC: dict[str, Any] = {
    "instructions": "agentrun contract canary: call canary_noop once, then answer the marker.",
    "model": "agentrun-canary",
    "tools": [CANARY_TOOL],
    "limits": {"max_steps": 12, "max_tool_calls": 2, "deadline_seconds": 60},
}
FAST_SPEC: dict[str, Any] = {**SPEC, "fast_path": True}
DEFAULT_TIMEOUT = 10.0
MAX_TIMEOUT = 300.0
POLL_SECONDS = 0.05
__all__ = ["MARKER", "Canary", "CanaryServicer", "Outcome"]


@dataclass(frozen=True)
class Outcome:
    verdict: str
    run: Run | None  # the contract run (None: it was not admitted)
    elapsed: float
    failed: Failed | None = None  # None: passed

    @property
    def passed(self) -> bool:
        return self.failed is None


async def _version(pool: Pool, agent_id: str, spec: dict[str, Any]) -> Any:
    """A canary agent's current version, created (or re-published) as needed."""
    await agent_store.ensure_workspace(pool, CANARY_WORKSPACE)
    await agent_store.create_agent(pool, CANARY_WORKSPACE, agent_id, "contract canary")
    latest = await agent_store.get_version(pool, CANARY_WORKSPACE, agent_id, 0)
    if latest is not None and convert_spec(latest["spec"]) == spec:
        return latest
    return await agent_store.publish_version(pool, CANARY_WORKSPACE, agent_id, spec)


def convert_spec(spec: Any) -> Any:
    return json.loads(spec) if isinstance(spec, str) else spec


async def nobody_to_run_it(dispatcher: Dispatcher, release: str | None) -> Failed | None:
    """Why no executor could take the canary now (None: one could): a FAIL at once, not
    recorded on the release (it is not the release's doing)."""
    states = await release_store.list_releases(dispatcher.pool, live_seconds(dispatcher.config))
    claim = stages.claimed_on(release)
    if release is None and newest_of(states, dispatcher.config.release_gate) is None:
        return Failed(claim, "no release takes new runs (no executor connected)")
    if release is not None and not any(s.release == release and s.executors for s in states):
        return Failed(claim, f"no executor of release {release} is connected")
    return None


class Canary:
    """Runs canaries on this replica: the contract run, a session turn, a fast-path turn."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher
        self._pool: Pool = dispatcher.pool
        self._fast = FastPath(dispatcher)
        self._conversations = Conversations(
            dispatcher.pool,
            dispatcher.config.defaults,
            dispatcher.poke,
            dispatcher.cancel,
            self._fast,
        )

    async def nobody_to_run_it(self, release: str | None) -> Failed | None:
        return await nobody_to_run_it(self._dispatcher, release)

    async def run(self, release: str | None, wait_for: float) -> Outcome:
        """One canary (pinned to `release`; None: the newest takes it), its outcome recorded
        on the release it ran on."""
        started = time.monotonic()
        deadline = started + wait_for
        run, failed = await self._contract(release, deadline, wait_for)
        # The turns go to the release the contract run was claimed on.
        on = release or (run.release if run is not None else None)
        how = ""
        if failed is None:
            failed, _ = await self._turn(stages.SESSION_TURN, on, deadline, wait_for)
        if failed is None:
            failed, how = await self._turn(stages.FAST_PATH_TURN, on, deadline, wait_for)
        elapsed = time.monotonic() - started
        if on is not None:
            await self._record(on, failed)
        return Outcome(_verdict(run, on, failed, elapsed, how), run, elapsed, failed)

    async def _record(self, release: str, failed: Failed | None) -> None:
        if failed is None:
            await release_store.canary_passed(self._pool, release)
            self._dispatcher.poke()  # runs waiting for an open release: claim them now
        else:
            await canary_store.failed(self._pool, release, failed.stage, failed.reason)

    async def _contract(
        self, release: str | None, deadline: float, wait_for: float
    ) -> tuple[Run | None, Failed | None]:
        nonce = secrets.token_hex(16)
        try:
            version = await _version(self._pool, CANARY_AGENT, SPEC)
            adm = admission(
                version,
                self._dispatcher.config.defaults,
                f"contract canary canary-nonce:{nonce}",
                started_by=auth_context.label_or_none(),
            )
            run = await release_store.admit_on(self._pool, adm, release)
        except Exception as exc:  # noqa: BLE001 - the stage's failure, named
            return None, Failed(stages.ADMITTED, f"{type(exc).__name__}: {exc}")
        self._dispatcher.poke()
        return await self._judged(run, nonce, release, deadline, wait_for)

    async def _turn(
        self, stage: str, release: str | None, deadline: float, wait_for: float
    ) -> tuple[Failed | None, str]:
        """A one-turn session on `release`: its failure, named `stage`, and how a fast-path
        turn was dispatched."""
        fast = stage == stages.FAST_PATH_TURN
        nonce = secrets.token_hex(16)
        offered = fast and self._free_stream(release)
        try:
            turn = await self._send(stage, nonce, release, fast)
        except Exception as exc:  # noqa: BLE001 - the stage's failure, named
            return Failed(stage, f"not admitted: {type(exc).__name__}: {exc}"), ""
        how = ""
        if fast:
            dispatched = turn["status"] != "queued"
            if offered and not dispatched:
                refused = Failed(stage, "SendMessage left it queued though a stream had room")
                await self._cancel(turn["run_id"], refused)
                return refused, ""
            how = "on the fast path" if dispatched else "by the claim: no stream here had room"
        run = await run_store.get_run(self._pool, CANARY_WORKSPACE, turn["run_id"])
        assert run is not None  # admitted just now; canary runs outlive a canary by an hour
        _, failed = await self._judged(run, nonce, release, deadline, wait_for)
        return (failed.inside(stage) if failed is not None else None), how

    async def _send(self, stage: str, nonce: str, release: str | None, fast: bool) -> Any:
        """The turn of a message to a new session of a canary agent (the fast-path one for
        the fast-path turn), as SendMessage admits it, on `release`. A new session each
        time: its one turn carries no earlier turn's nonce in its transcript."""
        agent_id, spec = (CANARY_FAST_AGENT, FAST_SPEC) if fast else (CANARY_AGENT, SPEC)
        await _version(self._pool, agent_id, spec)
        session, _ = await self._conversations.create(
            CANARY_WORKSPACE, agent_id, f"canary {stage}", INTERRUPT
        )
        text = f"contract canary {stage} canary-nonce:{nonce}"
        turn, _ = await self._conversations.send(
            CANARY_WORKSPACE, session["session_id"], text, None, release=release
        )
        return turn

    def _free_stream(self, release: str | None) -> bool:
        """Whether a stream of `release` (None: any) on this replica has a free slot now."""
        return any(
            release in (None, s.slots.release) and s.slots.credits > 0 and not s.slots.draining
            for s in self._dispatcher.sessions()
        )

    async def _judged(
        self, run: Run, nonce: str, release: str | None, deadline: float, wait_for: float
    ) -> tuple[Run, Failed | None]:
        """Wait for the run to end (or the deadline): the run then, and the stage it did not
        reach."""
        while not stages.settled(run) and time.monotonic() < deadline:
            await asyncio.sleep(POLL_SECONDS)
            run = await run_store.get_run(self._pool, CANARY_WORKSPACE, run.run_id) or run
        logs = await step_store.steps_for_runs(self._pool, [(CANARY_WORKSPACE, run.run_id)])
        failed = stages.run_failure(run, logs[run.run_id], nonce, release, wait_for)
        if failed is not None:
            await self._cancel(run.run_id, failed)
        return run, failed

    async def _cancel(self, run_id: Any, failed: Failed) -> None:
        """A failed canary's run, if unfinished, holds nothing of the release any longer."""
        reason = f"canary failed at {failed.stage}"
        row = await run_store.cancel_run(self._pool, CANARY_WORKSPACE, run_id, reason)
        if row is not None:
            run_figures.FIGURES.cancelled(row)
            self._dispatcher.cancel(CANARY_WORKSPACE, run_id, reason)


def _verdict(
    run: Run | None, release: str | None, failed: Failed | None, elapsed: float, how: str = ""
) -> str:
    """One line for a deploy script: PASS, or FAIL naming the stage and why."""
    where = f"on release {release or '(none)'}"
    if run is not None:
        where = f"run {run.run_id} {where}"
    if failed is None:
        fast = f" ({how})" if how else ""
        return (
            f"PASS canary {where} completed with the protocol marker, then a session turn and "
            f"a fast-path turn{fast}, in {elapsed:.2f}s"
        )
    return f"FAIL canary {where} at stage '{failed.stage}': {failed.reason}"


class CanaryServicer(release_pb2_grpc.CanaryServiceServicer):
    def __init__(self, canary: Canary, dispatcher: Dispatcher) -> None:
        self._canary = canary
        self._dispatcher = dispatcher

    async def RunCanary(
        self, request: release_pb2.RunCanaryRequest, context: grpc.aio.ServicerContext
    ) -> release_pb2.RunCanaryResponse:
        release = release_name("release", request.release) if request.release else None
        timeout = DEFAULT_TIMEOUT
        if request.HasField("timeout"):
            timeout = request.timeout.ToNanoseconds() / 1e9
            if not 0 < timeout <= MAX_TIMEOUT:
                raise InvalidArgument("timeout", "must be more than 0 and at most 5 minutes")
        if (why := await nobody_to_run_it(self._dispatcher, release)) is not None:
            return release_pb2.RunCanaryResponse(
                passed=False,
                verdict=_verdict(None, release, why, 0.0),
                failed_stage=why.stage,
                failure_reason=why.reason,
            )
        # Answer (a FAIL) before the caller's own deadline rather than run into it.
        remaining = context.time_remaining()
        if remaining is not None:
            timeout = max(0.1, min(timeout, remaining - 0.5))
        out = await self._canary.run(release, timeout)
        resp = release_pb2.RunCanaryResponse(
            passed=out.passed, verdict=out.verdict, elapsed=convert.duration(out.elapsed)
        )
        if out.run is not None:
            resp.run_id, resp.status = str(out.run.run_id), out.run.status
            resp.release = out.run.release or ""
        if out.failed is not None:
            resp.failed_stage, resp.failure_reason = out.failed.stage, out.failed.reason
        return resp
