"""One commit pipeline: the fenced statement and the effects a commit calls for, in one transaction.

A commit is the fenced statement (store/steps.py) plus zero or more effects. Which effects
it calls for is read off the commit itself: the wait reason of its park (`on_park`) and the
fields its Commit message sets (`on_field`: an approval request). Effects are objects the
features register where the server is assembled (control_plane/server.py), the way River
hangs work on hooks rather than inside its completer: a new wait kind registers an effect,
and neither the session nor this module changes.

A commit that calls for no effect, by far the most common, goes to the group commit
(dispatch/commits.py) as it always did: a dictionary lookup and a field test decide that.
One that calls for effects is prepared first, outside any transaction (an effect reads what
it needs, refuses the commit with CommitRefused, narrows its transition, or finds it is not
for it after all: then it is a plain commit), and is then committed in one transaction: the
fenced statement, then each effect's writes. A fenced commit writes nothing; an effect that
raises takes the steps down with it; a duplicate (a commit resent after it landed) does its
effects no second time. Effects that made another run runnable poke the dispatcher once the
transaction committed.

After either, the after-commit effects (`after_commit`: the credits' top-up) see the result
outside the transaction and may change what the executor is told. An unexpected error is
tried again, the whole commit, a few times; a fence, a refused value or a refused commit is
final.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import faults
from agentrun.v1 import executor_pb2 as pb
from control_plane.dispatch.commits import CommitGroups, groups_for
from control_plane.dispatch.requests import Price, commit_request, unpriced
from control_plane.store import steps
from control_plane.store.db import Connection, Pool, transaction
from control_plane.store.errors import DataRefused, Fenced, transient
from control_plane.store.steps import CommitRequest, CommitResult

log = logging.getLogger(__name__)

# An unexpected (not transient) error in the commit transaction is tried this
# many times in all; then the run fails with the error's request id.
COMMIT_TRIES = 3
COMMIT_RETRY_PAUSE = 0.05
_NO_MESSAGE = pb.Commit()


class CommitRefused(ValueError):
    """An effect refused the commit (what the executor asked for contradicts the commit
    itself): the run's INVALID outcome; nothing was written."""


@dataclass(frozen=True)
class Work:
    """What one effect does for one commit."""

    # Its writes, in the commit's transaction after the fenced statement; True when they
    # made another run runnable (the dispatcher is poked once the transaction committed).
    apply: Callable[[Connection], Awaitable[bool]]
    # The request to commit in place of the one sent (an effect may narrow the transition).
    req: CommitRequest | None = None


class Effect(Protocol):
    """Work that commits of one kind call for."""

    async def prepare(self, db: Pool, req: CommitRequest, msg: pb.Commit) -> Work | None:
        """Its work for this commit, read before the transaction; None: none for this one.
        Raises CommitRefused to refuse the commit."""


class AfterCommit(Protocol):
    """Work after a commit landed, outside its transaction; it may change the result."""

    def due(self, req: CommitRequest, result: CommitResult) -> bool: ...

    async def settle(self, db: Pool, req: CommitRequest, result: CommitResult) -> CommitResult:
        """The result the executor is told."""


def _nothing() -> None:
    return None


class CommitPipeline:
    """Commits through the group commit, or with the effects they call for in one transaction."""

    def __init__(
        self, db: Pool, price: Price = unpriced, on_runnable: Callable[[], None] = _nothing
    ) -> None:
        self._db = db
        self._price = price
        self._on_runnable = on_runnable
        self._fields: dict[str, list[Effect]] = {}
        self._parks: dict[str, list[Effect]] = {}
        self._after: list[AfterCommit] = []
        self._groups: CommitGroups | None = None  # the pool's, found at the first commit

    def on_field(self, name: str, effect: Effect) -> None:
        """`effect` for every commit whose message sets the field `name`."""
        self._fields.setdefault(name, []).append(effect)

    def on_park(self, wait_reason: str, effect: Effect) -> None:
        """`effect` for every commit that parks the run for `wait_reason`."""
        self._parks.setdefault(wait_reason, []).append(effect)

    def after_commit(self, effect: AfterCommit) -> None:
        """`effect` for every commit that lands, once it has (plain or not)."""
        self._after.append(effect)

    def request(self, msg: pb.Commit, renew_always: bool = True) -> CommitRequest:
        """The store's view of `msg`, priced (ValueError: a malformed commit)."""
        return commit_request(msg, self._price, renew_always)

    async def commit(
        self, req: CommitRequest, lease_seconds: float, msg: pb.Commit = _NO_MESSAGE
    ) -> CommitResult:
        """Commit `req` (sent as `msg`) with the effects it calls for, then settle it."""
        if faults.refuses("control_plane.commit.fence_admission"):  # a broken fence, for tests
            raise Fenced(f"run {req.run_id} is not held at epoch {req.epoch}")
        effects = self._called_for(req, msg)
        for attempt in range(1, COMMIT_TRIES + 1):
            try:
                if effects:
                    result = await self._with_effects(effects, req, msg, lease_seconds)
                else:  # the hot path
                    result = await (self._groups or self._group()).commit(req, lease_seconds)
                for after in self._after:
                    if after.due(req, result):
                        result = await after.settle(self._db, req, result)
                return result
            except (Fenced, DataRefused, CommitRefused):
                raise
            except Exception as exc:
                if transient(exc) or attempt == COMMIT_TRIES:
                    raise
                log.warning(
                    "commit of run %s failed (try %d of %d), trying again: %s",
                    req.run_id,
                    attempt,
                    COMMIT_TRIES,
                    type(exc).__name__,
                )
                await asyncio.sleep(COMMIT_RETRY_PAUSE * attempt)
        raise AssertionError("unreachable")

    def _called_for(self, req: CommitRequest, msg: pb.Commit) -> list[Effect]:
        """The effects of the fields `msg` sets, then those of the run's park."""
        found = [e for name, effects in self._fields.items() if msg.HasField(name) for e in effects]
        if req.transition.status == "waiting":
            found += self._parks.get(req.transition.wait_reason or "", ())
        return found

    def _group(self) -> CommitGroups:
        self._groups = groups_for(self._db)
        return self._groups

    async def _with_effects(
        self, effects: list[Effect], req: CommitRequest, msg: pb.Commit, lease_seconds: float
    ) -> CommitResult:
        """Prepare each effect, then commit the statement and their writes in one
        transaction; a plain commit when none of them has work for this one."""
        works = [w for e in effects if (w := await e.prepare(self._db, req, msg)) is not None]
        if not works:
            return await (self._groups or self._group()).commit(req, lease_seconds)
        req = next((w.req for w in works if w.req is not None), req)
        async with transaction(self._db) as conn:
            result = await steps.commit(conn, req, lease_seconds)
            if result.duplicate:  # its effects were done when it first landed
                return result
            runnable = [await work.apply(conn) for work in works]
        if any(runnable):
            self._on_runnable()
        return result
