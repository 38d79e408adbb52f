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
mid-check holds it no longer than that. A connect that finds the check taken
does nothing more (the check running covers the release); an executor of a
failing release that connected while this replica was checking it is tried
again when that check ends.

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
CLAIM_MARGIN_SECONDS = 30.0


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
        """The dispatcher's on_register callback: never blocks, never raises."""
        if stream.slots.release:
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
        hold = self._seconds + CLAIM_MARGIN_SECONDS
        if not await canary_store.take_check(self._pool, release, hold, executor_id):
            return  # passed already, checked by another replica now, or failing for this one
        log.info("release %s: self-check canary for executor %s's connect", release, executor_id)
        try:
            out = await self._canary.run(release, self._seconds)
        finally:
            with contextlib.suppress(Exception):  # else its claim lapses on its own
                await canary_store.check_done(self._pool, release, executor_id)
        if out.passed:
            log.info("release %s takes new runs: %s", release, out.verdict)
        else:
            log.warning("release %s takes no new runs: %s", release, out.verdict)
