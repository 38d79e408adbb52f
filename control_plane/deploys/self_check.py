"""The self-check: a release is canaried by itself when one of its executors connects.

With the release gate on (AGENTRUN_RELEASE_GATE=canary, the default) a release
takes new runs only once a canary on it passed, and a release whose last canary
failed takes none. Nobody has to run that canary: when an executor that declares
a release connects (the dispatcher registers its stream: Dispatcher.on_register),
this replica runs the contract canary (deploys/canary.py) pinned to that release,
if the release needs one: it never passed a canary, or its last canary failed
and this executor is not the one whose connect checked it last. The outcome is
recorded on the release like any canary's; a failure names the stage.

One check at a time per release, across replicas: a replica takes the check in
the database with a conditional UPDATE (sql/canary.sql release_canary_check_take)
that holds it for the check's time plus a margin, so a replica that crashed
mid-check holds it no longer than that. A connect that finds the check held by
another replica looks again once that hold is over (the check may have passed,
or its replica died with it); an executor that connected while this replica was
checking its release is looked at again when that check ends. A check finds an
executor of the release connected before it runs (else it waits for the next
connect, and records nothing: no executor is not the release's failure).

An executor that declares no release takes any run (the claim ignores releases
for it) and is never checked; with the gate off nothing is checked either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from control_plane.deploys.canary import Canary
from control_plane.dispatch.slots import Stream
from control_plane.store import canary as canary_store
from control_plane.store.db import Pool

log = logging.getLogger(__name__)

# How long a self-check waits for its three runs, and how much longer its claim holds.
CHECK_SECONDS = 30.0
CLAIM_MARGIN_SECONDS = 5.0


class SelfCheck:
    """Canaries the release of each executor that connects to this replica, when it needs it."""

    def __init__(self, canary: Canary, pool: Pool, check_seconds: float = CHECK_SECONDS) -> None:
        self._canary = canary
        self._pool = pool
        self._seconds = check_seconds
        self._connected: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        # The releases this replica checks now, and the executors that connected meanwhile.
        self._checking: dict[str, set[str]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def connected(self, stream: Stream) -> None:
        """The dispatcher's on_register callback: never blocks, never raises. A draining
        executor (its release drains) claims nothing, so it checks nothing either."""
        if stream.slots.release and not stream.slots.draining:
            self._connected.put_nowait((stream.slots.release, stream.executor_id))

    async def run_forever(self) -> None:
        """Check the release of each connect (releases at once, each release alone)."""
        try:
            while True:
                release, executor_id = await self._connected.get()
                if release in self._checking:
                    self._checking[release].add(executor_id)
                    continue
                self._checking[release] = set()
                task = asyncio.create_task(self._check(release, executor_id))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        finally:
            for task in list(self._tasks):
                task.cancel()

    def _later(self, seconds: float, release: str, executor_id: str) -> None:
        """Look at this connect again in `seconds`."""

        async def again() -> None:
            await asyncio.sleep(seconds + 0.1)
            self._connected.put_nowait((release, executor_id))

        task = asyncio.create_task(again())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _check(self, release: str, executor_id: str) -> None:
        try:
            await self._check_once(release, executor_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the next connect tries again
            log.warning("release %s: its self-check could not run: %s", release, exc)
        finally:
            # Executors that connected meanwhile: each one's connect is looked at again.
            for other in self._checking.pop(release, set()):
                self._connected.put_nowait((release, other))

    async def _check_once(self, release: str, executor_id: str) -> None:
        # The claim first: one UPDATE says "passed already" for most connects.
        hold = self._seconds + CLAIM_MARGIN_SECONDS
        check = await canary_store.take_check(self._pool, release, hold, executor_id)
        if check.held_for is not None:  # by another replica: look again once that is over
            self._later(check.held_for, release, executor_id)
        if not check.taken:
            return  # passed already, checked elsewhere now, or failing for this executor
        try:
            if await self._canary.nobody_to_run_it(release) is not None:
                return  # gone already: the next connect checks the release
            log.info("release %s: self-check canary for %s's connect", release, executor_id)
            out = await self._canary.run(release, self._seconds)
        finally:
            with contextlib.suppress(Exception):  # else its claim lapses on its own
                await canary_store.check_done(self._pool, release, executor_id)
        if out.passed:
            log.info("release %s takes new runs: %s", release, out.verdict)
        else:
            log.warning("release %s takes no new runs: %s", release, out.verdict)
