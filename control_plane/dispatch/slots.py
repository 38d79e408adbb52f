"""An executor stream's slots: its free credits, the runs it holds, and what it may be assigned.

The session owns one `Slots`; the dispatcher, the fast path and releases read and spend it
through the `Stream` protocol, so none of them imports the session (nor it them, in a
circle). Credits are taken before any await by whoever assigns a run (a claim, a fast-path
turn) and given back when the run does not go out after all.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from agentrun.v1 import executor_pb2 as pb
from control_plane.dispatch.liveness import Peer
from control_plane.ground.config import ServerConfig
from control_plane.store.lease import LeaseKey, Release
from control_plane.store.releases import DrainOrder

# What a claim groups executors by: scope, tools, release and the releases it continues.
ClaimGroup = tuple[tuple[str, ...] | None, frozenset[str], str, tuple[str, ...]]


def live_seconds(config: ServerConfig) -> float:
    """An executor seen within this long counts as connected (replicas touch every beat)."""
    return 3 * config.heartbeat_seconds


@dataclass(eq=False)
class Slots:
    """One stream's credits and held runs, and what it may be assigned."""

    # The workspaces its executor credential serves (None: all).
    scope: frozenset[str] | None = None
    credits: int = 0
    # The epoch of each run it holds, and the workspace of every run it held (the key of
    # the release when the stream breaks: dispatch/liveness.py).
    held: dict[uuid.UUID, int] = field(default_factory=dict)
    workspaces: dict[uuid.UUID, str] = field(default_factory=dict)
    # The tools it declared in Hello: it is assigned only runs needing no others.
    tools: frozenset[str] = frozenset()
    # Its release and those it continues (Hello); told to drain, it is assigned nothing.
    release: str = ""
    continues: tuple[str, ...] = ()
    draining: bool = False
    forced: bool = False

    def declare(self, hello: pb.Hello) -> None:
        """What the executor says it carries and holds (a reconnect keeps its leases)."""
        for lease in hello.held:
            self.hold(LeaseKey(lease.workspace_id, uuid.UUID(lease.run_id), lease.epoch))
        self.tools = frozenset(t.name for t in hello.tools)
        self.release, self.continues = hello.release, tuple(sorted(set(hello.continues)))

    def ready(self, slots: int) -> None:
        self.credits = max(0, self.credits + slots)

    def take(self) -> bool:
        """Spend a credit on a run about to be assigned; False when none is free."""
        if self.credits <= 0:
            return False
        self.credits -= 1
        return True

    def give_back(self) -> None:
        """The run a credit was taken for does not go out after all."""
        self.credits += 1

    def hold(self, key: LeaseKey) -> None:
        self.held[key.run_id] = key.epoch
        self.workspaces[key.run_id] = key.workspace_id

    def drop(self, run_id: uuid.UUID) -> int | None:
        """No longer held here (fenced, parked, finished or cancelled); its epoch, if it was."""
        return self.held.pop(run_id, None)

    def holds(self, run_id: uuid.UUID, epoch: int) -> bool:
        return self.held.get(run_id) == epoch

    def held_leases(self) -> list[LeaseKey]:
        return [
            LeaseKey(ws, run_id, epoch)
            for run_id, epoch in list(self.held.items())
            if (ws := self.workspaces.get(run_id)) is not None
        ]

    def serves(self, workspace_id: str) -> bool:
        return self.scope is None or workspace_id in self.scope

    def fits(self, workspace_id: str, tools: set[str]) -> bool:
        """Whether a claim could lease it a run of `workspace_id` needing `tools` now."""
        return (
            self.credits > 0
            and not self.draining
            and self.serves(workspace_id)
            and tools <= self.tools
        )

    def drain(self, draining: Mapping[str, DrainOrder]) -> DrainOrder | None:
        """Its release drains: no more credits, nothing more assigned. What to tell the
        executor, the first time, and again if the drain became forced (None: not its
        release, or told already). An executor not yet told is told only once no run
        pinned to its release waits for one of its executors: one that connects to a
        draining release (after a forced stop, say) first serves those runs (its claims
        take no others: release_share gives a draining release no share)."""
        order = draining.get(self.release)
        if order is None or (self.draining and (self.forced or not order.force)):
            return None
        if not self.draining and order.waiting:
            return None
        self.draining, self.forced, self.credits = True, order.force, 0
        return order

    def claim_group(self) -> ClaimGroup:
        scope = tuple(sorted(self.scope)) if self.scope is not None else None
        return scope, self.tools, self.release, self.continues

    def claim_release(self, config: ServerConfig) -> Release | None:
        """What its claims are held to (deploys/releases.py); None when it declares no release."""
        if not self.release:
            return None
        return Release(self.release, self.continues, live_seconds(config), config.release_gate)


class Stream(Peer, Protocol):
    """An executor stream as the dispatcher, the fast path and releases use it (the session
    of dispatch/session.py): liveness's view of it, and its slots."""

    slots: Slots
    reads_batches: bool

    def cancel(self, workspace_id: str, run_id: uuid.UUID, reason: str) -> None: ...

    def pause(self, workspace_id: str, run_id: uuid.UUID) -> None: ...

    def drain_if(self, draining: Mapping[str, DrainOrder]) -> None: ...
