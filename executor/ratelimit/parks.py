"""Rate-limit parks in the step log, and when the call they held back may go out on resume.

A call is parked on a rate limit after its `tool_started` step is committed
(the token is taken right before the request leaves, so that the provider
sees the rate the bucket allows). The park step says the request never
reached the provider: no token, Redis unreachable, or a 429. On resume that
call is an unknown outcome by the log's shape, but it is known not to have
happened, so it is sent again under its key whatever its class, provided no
executor held the run since the park (the park's epoch is the one before the
current lease's). Otherwise the run could have sent it since, and it is
resolved by its class as usual.

Any park may carry that mark (`unsent_mark`): a park on a connection, and a
run handed back because our own side held its call back (executor/run_loop.py).
"""

from __future__ import annotations

from agentrun.v1 import executor_pb2
from executor import steps
from executor.ratelimit.limiter import RateLimited
from executor.replay import PARK, Entry

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
        payload |= unsent_mark(call_seq, epoch)
    return steps.new_step(seq, PARK, payload)


def unsent_mark(call_seq: int, epoch: int) -> dict[str, int]:
    """A park's fields saying the call started at `call_seq` never left under lease `epoch`."""
    return {"unsent_call_seq": call_seq, "epoch": epoch}


def unsent(entries: list[Entry], started_seq: int, epoch: int) -> bool:
    """True when the call started at `started_seq` is known never to have reached its provider."""
    if not entries or entries[-1].kind != PARK:
        return False
    payload = entries[-1].payload
    return payload.get("unsent_call_seq") == started_seq and payload.get("epoch") == epoch - 1
