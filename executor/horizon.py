"""The send horizon: how long after a liveness acknowledgement the executor may still start
a tool request (the safety argument is in control_plane/store/sql/lease.sql).

Every session (Welcome to end of stream) is numbered. A lease is *guarded* by the
session whose Assignment granted it, when that session announced a horizon H. A
guarded lease permits a send only while

* its session is the current one and still alive, and
* less than H has passed, on this process's monotonic clock, since the *send*
  time of the last Ping the session acknowledged (counting from the send time,
  as HeldLease.renew does, never overestimates: the control plane received it
  later).

A lease carried over a reconnect (Hello.held) keeps heartbeating and committing
(both fenced by its epoch), but never permits a send again: the old session's
control plane may make it claimable at any time after its own horizon, whatever
this new session acknowledges. The run hands itself back instead and is claimed
afresh at a new epoch (executor/run_loop.py).

A lease granted by a session with no horizon (an older control plane) is not
guarded: its lease alone decides, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from contextvars import ContextVar

Clock = Callable[[], float]

# Why a send is refused for good (the lease's session is gone) or for now (no fresh ack).
SESSION_GONE = "the stream that granted this lease is gone"
STALE = "no recent liveness acknowledgement from the control plane"

# The run's own last-moment check, read right before a tool request leaves
# (executor/tools/http_tool.py): None to send, else why not. Set per run task.
SEND_GATE: ContextVar[Callable[[], str | None] | None] = ContextVar("send_gate", default=None)


class Refused(Exception):
    """A request our own side held back before any byte of it left: the send horizon, the
    lease, or the control plane it needed (a connection's token). Never a tool's outcome nor
    an answer the model reads: the run hands itself back, and the next holder sends the call
    under the same key (docs/protocol.md, "Our own failures").

    `may_have_left`: an earlier request of the same call, in the same delivery, may have
    reached the provider (a timeout, say), so the call is not known unsent."""

    def __init__(self, why: str, *, may_have_left: bool = False) -> None:
        super().__init__(why)
        self.may_have_left = may_have_left

    def after(self, exposed: bool) -> Refused:
        """This refusal, as one that came after a request that may have left, if `exposed`."""
        if not exposed or self.may_have_left:
            return self
        return Refused(str(self), may_have_left=True)


def blocked_now() -> str | None:
    """Why the current run may not send this instant (None: it may, or it has no gate)."""
    gate = SEND_GATE.get()
    return gate() if gate is not None else None


class SendHorizon:
    """The current session's number, its horizon, and its last acknowledged Ping."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self.session = 0
        self.horizon = 0.0
        self.alive = False
        self._acked_sent_at: float | None = None
        self._acked: asyncio.Event | None = None

    def begin(self, horizon: float) -> None:
        """A Welcome arrived: a new session, with the horizon it announced (0: none)."""
        self.session += 1
        self.horizon = max(0.0, horizon)
        self.alive = True
        self._acked_sent_at = None

    def end(self) -> None:
        """The session ended (or was declared dead): nothing it granted permits a send."""
        self.alive = False
        self._acked_sent_at = None
        self._wake()

    def ack(self, sent_at: float) -> None:
        """A Pong arrived for a Ping sent at `sent_at` (this session's)."""
        if self.alive and (self._acked_sent_at is None or sent_at > self._acked_sent_at):
            self._acked_sent_at = sent_at
        self._wake()

    def grant(self) -> int | None:
        """The session a lease granted now is guarded by (None: no horizon, unguarded)."""
        return self.session if self.alive and self.horizon > 0 else None

    def refuses(self, session: int | None) -> str | None:
        """Why a lease guarded by `session` may not send now (None: it may)."""
        if session is None:
            return None
        if session != self.session or not self.alive:
            return SESSION_GONE
        if self._acked_sent_at is None or self._clock() >= self._acked_sent_at + self.horizon:
            return STALE
        return None

    async def changed(self, within: float) -> None:
        """Wait for the next acknowledgement or session change, at most `within` seconds."""
        if self._acked is None:
            self._acked = asyncio.Event()
        self._acked.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._acked.wait(), within)

    def _wake(self) -> None:
        if self._acked is not None:
            self._acked.set()
