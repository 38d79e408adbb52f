"""The contract canary (issue 15): a deploy's proof that the whole run path works.

A liveness check is not enough: a mixed-version failure in the execution
fence passes every health check, because an empty queue looks healthy. So a
deploy runs `agentrun canary` (CanaryService.RunCanary): it admits a run of
an internal agent in an internal workspace (`agentrun-internal-canary`, a
reserved name, created on the first canary; no customer key belongs to it),
so it shows in no customer's lists and counts against no customer's caps or
credits. The run goes the way every run goes: the claim (on the release
asked for, or the newest), the claim-time context, the executor boundary,
fence admission of each commit, the built-in no-op tool's start and result
commits, and normal completion. The executor answers with a fixed protocol
marker in place of the model (executor/canary.py): no model is called and no
provider is touched. Only a completed run whose output is exactly the
marker with this canary's nonce passes; claimed, running, parked or failed
is a failure, and so is running out of time (default 10 s).
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
from control_plane.auth import context as auth_context
from control_plane.deploys.releases import newest_of, release_name
from control_plane.dispatch.slots import live_seconds
from control_plane.ground import convert
from control_plane.ground.errors import InvalidArgument
from control_plane.store import agents as agent_store
from control_plane.store import releases as release_store
from control_plane.store import runs as run_store
from control_plane.store.admission import admission
from control_plane.store.db import Pool
from control_plane.store.runs import Run

if TYPE_CHECKING:
    from control_plane.dispatch.dispatcher import Dispatcher

# Shared with executor/canary.py by value (the executor never imports the control plane).
CANARY_WORKSPACE = "agentrun-internal-canary"
CANARY_AGENT = "canary"
CANARY_TOOL = "canary_noop"
MARKER = "AGENTRUN-CANARY-OK/v1"
# A finished canary run is the verdict of one deploy step and nobody's data: the retention
# loop (control_plane/runs/retention.py) deletes it this long after it finished.
CANARY_KEEP = timedelta(hours=1)
SPEC: dict[str, Any] = {
    "instructions": "agentrun contract canary: call canary_noop once, then answer the marker.",
    "model": "agentrun-canary",
    "tools": [CANARY_TOOL],
    "limits": {"max_steps": 12, "max_tool_calls": 2, "deadline_seconds": 60},
}
DEFAULT_TIMEOUT = 10.0
MAX_TIMEOUT = 300.0
POLL_SECONDS = 0.05
TERMINAL = ("completed", "failed", "cancelled")


@dataclass(frozen=True)
class Outcome:
    passed: bool
    verdict: str
    run: Run
    elapsed: float


async def _version(pool: Pool) -> Any:
    """The canary agent's current version, created (or re-published) as needed."""
    await agent_store.ensure_workspace(pool, CANARY_WORKSPACE)
    await agent_store.create_agent(pool, CANARY_WORKSPACE, CANARY_AGENT, "contract canary")
    latest = await agent_store.get_version(pool, CANARY_WORKSPACE, CANARY_AGENT, 0)
    if latest is not None and convert_spec(latest["spec"]) == SPEC:
        return latest
    return await agent_store.publish_version(pool, CANARY_WORKSPACE, CANARY_AGENT, SPEC)


def convert_spec(spec: Any) -> Any:
    return json.loads(spec) if isinstance(spec, str) else spec


def verdict(run: Run, nonce: str, elapsed: float, timeout: float) -> tuple[bool, str]:
    """PASS only for a completed run whose output is exactly the marker and nonce."""
    where = f"run {run.run_id} on release {run.release or '(none)'}"
    if run.status == "completed" and run.output == f"{MARKER} {nonce}":
        return True, f"PASS canary {where} completed with the protocol marker in {elapsed:.2f}s"
    if run.status == "completed":
        return False, f"FAIL canary {where} completed without the protocol marker: {run.output!r}"
    if run.status in TERMINAL:
        return False, f"FAIL canary {where} {run.status}: {run.error or 'no error recorded'}"
    if run.lease_epoch == 0:
        return False, (
            f"FAIL canary {where} was never claimed within {timeout:g}s "
            "(no executor of its release took it)"
        )
    return False, (
        f"FAIL canary {where} is {run.status} after {timeout:g}s, not completed: claimed "
        f"{run.lease_epoch} time(s), {run.step_count} step(s) admitted (last holder "
        f"{run.lease_owner or 'none'})"
    )


async def nobody_to_run_it(dispatcher: Dispatcher, release: str | None) -> str | None:
    """Why no executor could take the canary now (None: one could): a FAIL at once."""
    states = await release_store.list_releases(dispatcher.pool, live_seconds(dispatcher.config))
    if release is None and newest_of(states, dispatcher.config.release_gate) is None:
        return "FAIL canary: no release takes new runs (no executor connected)"
    if release is not None and not any(s.release == release and s.executors for s in states):
        return f"FAIL canary: no executor of release {release} is connected"
    return None


async def run_canary(dispatcher: Dispatcher, release: str | None, wait_for: float) -> Outcome:
    pool = dispatcher.pool
    started = time.monotonic()
    version = await _version(pool)
    nonce = secrets.token_hex(16)
    adm = admission(
        version,
        dispatcher.config.defaults,
        f"contract canary canary-nonce:{nonce}",
        started_by=auth_context.label_or_none(),
    )
    run = await release_store.admit_on(pool, adm, release)
    dispatcher.poke()
    deadline = started + wait_for
    while True:
        run = await run_store.get_run(pool, CANARY_WORKSPACE, run.run_id) or run
        if run.status in TERMINAL or time.monotonic() >= deadline:
            break
        await asyncio.sleep(POLL_SECONDS)
    elapsed = time.monotonic() - started
    passed, line = verdict(run, nonce, elapsed, wait_for)
    if passed and run.release:
        await release_store.canary_passed(pool, run.release)
    return Outcome(passed, line, run, elapsed)


class CanaryServicer(release_pb2_grpc.CanaryServiceServicer):
    def __init__(self, dispatcher: Dispatcher) -> None:
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
            return release_pb2.RunCanaryResponse(passed=False, verdict=why)
        # Answer (a FAIL) before the caller's own deadline rather than run into it.
        remaining = context.time_remaining()
        if remaining is not None:
            timeout = max(0.1, min(timeout, remaining - 0.5))
        out = await run_canary(self._dispatcher, release, timeout)
        return release_pb2.RunCanaryResponse(
            passed=out.passed,
            verdict=out.verdict,
            run_id=str(out.run.run_id),
            status=out.run.status,
            release=out.run.release or "",
            elapsed=convert.duration(out.elapsed),
        )
