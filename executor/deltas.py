"""A model call's text as it is generated, sent on the executor's stream in small chunks
(ConnectRequest.delta) for the run's watchers and its Durable Stream (docs/streams.md).

A side channel of the call: the committed decision stays the record. Each chunk carries
the idempotent producer's triple — the lease (this executor's hold of the run, at its
epoch), the decision's seq and the chunk's index — so the control plane keeps it at most
once, and only while that epoch holds the run (a fenced holder's chunks land nowhere).

The provider's pieces (often a token each) are gathered: the first goes at once, the
ones after it at most every CHUNK_SECONDS, or as soon as CHUNK_CHARS are waiting; `flush`
sends what is left when the call ends, before its decision is committed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from agentrun.v1 import executor_pb2

CHUNK_SECONDS = 0.05
CHUNK_CHARS = 512


class Chunks:
    """The chunks of one model call (decision `seq`) under `lease`."""

    def __init__(
        self,
        send: Callable[[executor_pb2.ModelDelta], object],
        lease: executor_pb2.Lease,
        seq: int,
    ) -> None:
        self._send, self._lease, self._seq = send, lease, seq
        self._pending: list[str] = []
        self._size = 0
        self._index = 0
        self._timer: asyncio.TimerHandle | None = None

    def piece(self, text: str) -> None:
        """One piece of the reply's text, as the provider streamed it."""
        if not text:
            return
        self._pending.append(text)
        self._size += len(text)
        if self._timer is None or self._size >= CHUNK_CHARS:
            self._send_pending()

    def flush(self) -> None:
        """Send what is waiting (the call ended): nothing is sent after this."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._send_pending(again=False)

    def _tick(self) -> None:
        self._timer = None
        self._send_pending()

    def _send_pending(self, again: bool = True) -> None:
        if not self._pending:
            return
        text = "".join(self._pending)
        self._pending, self._size = [], 0
        delta = executor_pb2.ModelDelta(
            lease=self._lease, seq=self._seq, index=self._index, text=text
        )
        self._index += 1
        self._send(delta)
        if again and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(CHUNK_SECONDS, self._tick)
