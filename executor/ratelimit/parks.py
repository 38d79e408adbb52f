"""Rate-limit parks in the step log.

A call is parked on a rate limit after its `tool_started` step is committed
(the token is taken right before the request leaves, so that the provider
sees the rate the bucket allows). The park step says the request never
reached the provider (no token, Redis unreachable, or a 429) with the mark
executor/steps.py defines (`unsent_mark`, `known_unsent`), so the call goes
out again on resume under its key whatever its class.
"""

from __future__ import annotations

from agentrun.v1 import executor_pb2
from executor import steps
from executor.ratelimit.limiter import RateLimited
from executor.replay import PARK

WAIT_REASON = "rate"


def park_step(
    seq: int, limited: RateLimited, call_seq: int | None, epoch: int
) -> executor_pb2.NewStep:
    """A rate park; with `call_seq`, it records that call as never sent, under lease `epoch`."""
    payload: dict[str, object] = {
        "wait_reason": WAIT_REASON,
        "wake_after_seconds": limited.wake_after,
        "note": limited.note,
        "cause": limited.cause,
    }
    if call_seq is not None and not limited.after_send:
        payload |= steps.unsent_mark(call_seq, epoch)
    return steps.new_step(seq, PARK, payload)
