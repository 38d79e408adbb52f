"""Group the plain commits that arrive in one event-loop tick into one statement.

Every executor stream spawns a task per Commit message; those spawned in the same
tick (several runs' commits read off one stream, or off several) reach `commit`
before the loop runs the flush it scheduled with `call_soon`, so those of one
workspace go to the database together: one round trip, one transaction and one WAL
flush for all of them (store/sql/steps.sql, run_commit_many). One statement per
workspace, so that on Citus each is on one shard; those of a tick's several
workspaces go out side by side. Nothing waits for company: a commit
alone in its tick goes as it did before, through `steps.commit`, at once. Only when
MAX_IN_FLIGHT statements are out already do new commits wait, for the first of them
to return, and then go together (group commit, as Postgres does for WAL flushes).

Fencing stays per run: a run no longer held under its epoch is left out of the
statement and answered Fenced alone, and an error of one request (a retried
duplicate, a refused payload) makes each commit on its own, so no run's commit
fails because of another's. A run appears at most once per statement: a second
commit of the same run in one tick (a retry racing its first try) goes in another.

The statements go over connections the groups hold between them (lanes, at most
MAX_IN_FLIGHT), not through a pool acquire and release each: the release is a task of
its own and a timer, 0.1-0.15 ms of a commit's round trip here (docs/scaling.md). A lane
goes back to the pool once idle for LANE_IDLE_SECONDS, when its statement ended other than
cleanly (a broken connection, a timeout; the pool's release knows how to recover those),
and on `close`, which the server calls before it closes the pool.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from control_plane.store import steps as step_store
from control_plane.store.db import Lane, Pool
from control_plane.store.errors import CommitConflict, DataRefused, Fenced

# The most commits in one statement (its arrays stay small; the rest go in another).
MAX_GROUP = 100
# The most group statements in flight at once. Commits arriving while that many are out
# wait for the first to return, then go together (group commit): under load the groups
# grow instead of the statements multiplying; under none, nothing waits.
MAX_IN_FLIGHT = 2
# A lane unused this long goes back to the pool (a quiet replica holds no connection).
LANE_IDLE_SECONDS = 5.0
# A statement's outcomes that leave its connection as it was (the server answered).
_CLEAN_ERRORS = (Fenced, CommitConflict, DataRefused)


@dataclass(frozen=True)
class _Waiting:
    req: step_store.CommitRequest
    lease_seconds: float
    answer: asyncio.Future[step_store.CommitResult]


class CommitGroups:
    """The pending plain commits of one pool, flushed once per event-loop tick."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self._waiting: list[_Waiting] = []
        self._flushing: set[asyncio.Task[None]] = set()
        self._scheduled = False
        # Connections held between statements, and when each was last used.
        self._lanes: list[tuple[Lane, float]] = []
        self._idle_timer: asyncio.TimerHandle | None = None
        self._releasing: set[asyncio.Task[None]] = set()
        self._closed = False
        self.statements = 0  # statements sent, and the commits in them (for tests and bench)
        self.grouped = 0

    async def commit(
        self, req: step_store.CommitRequest, lease_seconds: float
    ) -> step_store.CommitResult:
        """`steps.commit(pool, req, lease_seconds)`, sent with the tick's other commits."""
        loop = asyncio.get_running_loop()
        waiting = _Waiting(req, lease_seconds, loop.create_future())
        self._waiting.append(waiting)
        self._schedule()
        return await waiting.answer

    def _schedule(self) -> None:
        """Flush at the end of this tick, unless a flush is due already or the statements
        in flight are at the cap (the last of them to return schedules it)."""
        if self._waiting and not self._scheduled and len(self._flushing) < MAX_IN_FLIGHT:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        pending, self._waiting = self._waiting, []
        for group in _groups(pending):
            task = asyncio.create_task(self._send(group))
            self._flushing.add(task)
            task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._flushing.discard(task)
        self._schedule()

    async def close(self) -> None:
        """Hand the lanes back to the pool (before it closes: it waits for them); a
        statement in flight hands its own back when it ends."""
        self._closed = True
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        lanes, self._lanes = self._lanes, []
        for conn, _ in lanes:
            await self.pool.release(conn)
        if self._releasing:
            await asyncio.wait(self._releasing)

    async def _lane(self) -> Lane:
        while self._lanes:
            conn, _ = self._lanes.pop()
            if not conn.is_closed():
                return conn
            await self.pool.release(conn)
        return await self.pool.acquire()

    def _keep(self, conn: Lane) -> None:
        if len(self._lanes) >= MAX_IN_FLIGHT:  # more were out at once than are kept
            self._release(conn)
            return
        self._lanes.append((conn, time.monotonic()))  # in order of last use (_lane pops the last)
        if self._idle_timer is None:
            self._idle_timer = asyncio.get_running_loop().call_later(
                LANE_IDLE_SECONDS, self._release_idle
            )

    def _release_idle(self) -> None:
        """Lanes idle for LANE_IDLE_SECONDS go back to the pool; checked again when the
        oldest of those left will be."""
        self._idle_timer = None
        now = time.monotonic()
        while self._lanes and self._lanes[0][1] <= now - LANE_IDLE_SECONDS:
            self._release(self._lanes.pop(0)[0])
        if self._lanes:
            self._idle_timer = asyncio.get_running_loop().call_later(
                self._lanes[0][1] + LANE_IDLE_SECONDS - now, self._release_idle
            )

    def _release(self, conn: Lane) -> None:
        task = asyncio.create_task(self.pool.release(conn))
        self._releasing.add(task)  # held, so it is not collected before it ends
        task.add_done_callback(self._releasing.discard)

    async def _send(self, group: list[_Waiting]) -> None:
        self.statements += 1
        self.grouped += len(group)
        reqs = [w.req for w in group]
        results: list[step_store.CommitResult | BaseException]
        conn: Lane | None = None
        try:
            conn = await self._lane()
            if len(group) == 1:
                results = [
                    await step_store.commit(self.pool, reqs[0], group[0].lease_seconds, via=conn)
                ]
            else:
                results = await step_store.commit_many(
                    self.pool, reqs, group[0].lease_seconds, via=conn
                )
        except Exception as exc:  # noqa: BLE001 - the commit's own error, handed to its caller
            results = [exc]
        except BaseException:  # cancelled mid-statement: the pool's release recovers the lane
            if conn is not None:
                self._release(conn)
            raise
        if conn is not None:
            clean = all(
                not isinstance(r, BaseException) or isinstance(r, _CLEAN_ERRORS) for r in results
            )
            if clean and not self._closed and not conn.is_closed():
                self._keep(conn)
            else:
                self._release(conn)
        for waiting, result in zip(group, results, strict=True):
            if waiting.answer.done():  # its stream went away meanwhile
                continue
            if isinstance(result, BaseException):
                waiting.answer.set_exception(result)
            else:
                waiting.answer.set_result(result)


def _groups(pending: list[_Waiting]) -> list[list[_Waiting]]:
    """Split into statements: one workspace and lease duration per statement, each run
    once in it, in order. One workspace, because a statement that locks runs of several
    would span shards on Citus, which refuses it (docs/scaling.md)."""
    groups: list[tuple[set[tuple[str, object]], list[_Waiting]]] = []
    for waiting in pending:
        key = (waiting.req.workspace_id, waiting.req.run_id)
        home = next(
            (
                g
                for g in groups
                if key not in g[0]
                and len(g[1]) < MAX_GROUP
                and g[1][0].lease_seconds == waiting.lease_seconds
                and g[1][0].req.workspace_id == waiting.req.workspace_id
            ),
            None,
        )
        if home is None:
            home = (set(), [])
            groups.append(home)
        home[0].add(key)
        home[1].append(waiting)
    return [members for _, members in groups]


# By id(pool); an entry keeps its pool alive, so the id is not reused while it is here.
_BY_POOL: dict[int, CommitGroups] = {}


async def close_for(pool: Pool) -> None:
    """Hand back the lanes of `pool`'s groups, if it has any (before the pool closes)."""
    found = _BY_POOL.get(id(pool))
    if found is not None and found.pool is pool:
        del _BY_POOL[id(pool)]
        await found.close()


def groups_for(pool: Pool) -> CommitGroups:
    """The one CommitGroups of a pool (every stream of a replica shares it)."""
    found = _BY_POOL.get(id(pool))
    if found is None or found.pool is not pool:
        for key in [k for k, g in _BY_POOL.items() if g.pool.is_closing()]:
            del _BY_POOL[key]  # pools closed since (tests start many servers)
        found = _BY_POOL[id(pool)] = CommitGroups(pool)
    return found
