"""Named fault points: inert in production, armed by tests through the environment.

A fault point marks a place where a crash is interesting ("the decision is
committed but no tool has started"). Tests arm points to make each crash
deterministic, or arm all of them at random for chaos runs:

    AGENTRUN_FAULTS="executor.decision.after_commit=kill"      # first hit
    AGENTRUN_FAULTS="executor.tool.after_response=kill@3"      # third hit
    AGENTRUN_FAULTS_RANDOM="0.02" AGENTRUN_FAULTS_SEED="7"     # any point, p=0.02

Two actions. `kill` (the default) is SIGKILL of the current process: a real
crash, with no cleanup, no flushed buffers and no goodbye to the control
plane; `@n` picks the nth hit. `raise` raises `InjectedFault` (a bug, as far
as the caller can tell) at every hit from the nth on:

    AGENTRUN_FAULTS="control_plane.commit.in_transaction=raise"     # every hit

`raises(name)` marks a point only `raise` arms (random faults never kill there):

    AGENTRUN_FAULTS="control_plane.dispatch.assignment=raise@2"     # the 2nd hit on

A third, `refuse`, is for checks rather than crashes: `refuses(name)` is True
at every hit from the nth on, and the caller refuses what it would admit. The
control plane's fence admission has one (a mixed-version fence failure that
passes every health check, which only the contract canary notices):

    AGENTRUN_FAULTS="control_plane.commit.fence_admission=refuse"

Code run `within(prefix)` hits only the points named under `prefix`; every other point is
inert there, neither counted nor fired (random faults included). The executor drives canary
runs so (executor/worker.py): the self-check canary that each executor's connect starts
takes none of the hits a test armed for customer runs, and `executor.canary.*` points
break the canary alone.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
from collections import Counter
from collections.abc import Iterator
from contextvars import ContextVar

_hits: Counter[str] = Counter()


class InjectedFault(RuntimeError):
    """Raised by a point armed with `raise`: an unexpected error, not a transient one."""


def _parse_actions(spec: str) -> dict[str, tuple[str, int]]:
    armed: dict[str, tuple[str, int]] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, action = item.partition("=")
        action = action or "kill"
        verb, _, nth = action.partition("@")
        if verb not in ("kill", "raise", "refuse"):
            raise ValueError(f"AGENTRUN_FAULTS: unknown action {verb!r} for {name!r}")
        armed[name.strip()] = (verb, int(nth) if nth else 1)
    return armed


def _parse(spec: str) -> dict[str, int]:
    """Which hit of each armed point fires first."""
    return {name: nth for name, (_, nth) in _parse_actions(spec).items()}


_actions = _parse_actions(os.environ.get("AGENTRUN_FAULTS", ""))
_armed = _parse(os.environ.get("AGENTRUN_FAULTS", ""))
_random_p = float(os.environ.get("AGENTRUN_FAULTS_RANDOM", "0") or 0)
_rng = random.Random(os.environ.get("AGENTRUN_FAULTS_SEED"))


_within: ContextVar[str | None] = ContextVar("agentrun_faults_within", default=None)


@contextlib.contextmanager
def within(prefix: str) -> Iterator[None]:
    """Only points named under `prefix` count and fire in the enclosed code (its task)."""
    token = _within.set(prefix)
    try:
        yield
    finally:
        _within.reset(token)


def _inert(name: str) -> bool:
    prefix = _within.get()
    return prefix is not None and not name.startswith(prefix)


def active() -> bool:
    """Whether any point can fire in this process (a test armed one, or random faults)."""
    return bool(_armed or _random_p)


def point(name: str) -> None:
    """Crash (or raise) here if a test armed this point (or random faults are on)."""
    if (not _armed and not _random_p) or _inert(name):
        return
    _hits[name] += 1
    verb, nth = _actions.get(name, ("kill", 0))
    if verb == "raise" and _hits[name] >= nth:
        raise _injected(name)
    fires = verb == "kill" and nth == _hits[name]
    if fires or (_random_p and _rng.random() < _random_p):
        sys.stderr.write(f"fault point {name}: killing pid {os.getpid()}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def refuses(name: str) -> bool:
    """True if a test armed this check point with `refuse` (from its nth hit on)."""
    if not _armed or _inert(name):
        return False
    verb, nth = _actions.get(name, ("kill", 0))
    if verb != "refuse":
        return False
    _hits[name] += 1
    return _hits[name] >= nth


def raises(name: str) -> None:
    """`point` for a place where only a bug is interesting, not a crash: raises
    `InjectedFault` from its nth hit on if a test armed it with `raise`, and never kills
    (random faults pass it by)."""
    if not _armed or _inert(name):
        return
    verb, nth = _actions.get(name, ("kill", 0))
    if verb != "raise":
        return
    _hits[name] += 1
    if _hits[name] >= nth:
        raise _injected(name)


def _injected(name: str) -> InjectedFault:
    """The fault a point armed with `raise` raises (raised where the point is), said on
    stderr."""
    sys.stderr.write(f"fault point {name}: raising (hit {_hits[name]})\n")
    return InjectedFault(f"fault point {name}")
