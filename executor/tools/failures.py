"""Why a tool request failed, told by whether it may have reached the provider.

* ``not_sent`` — refused before any byte left (the connection failed): safe
  to send again, whatever the class;
* ``rate_limited`` — a 429: the provider refused it before acting; send again
  after its Retry-After;
* ``key_in_use`` — a 409 from a keyed provider: a request with the same key
  is still being processed; send the same key again later;
* ``maybe_applied`` — a timeout or reset after the request was written, or a
  5xx: it may have been applied. Reads and ``provider_key`` writes are sent
  again; a ``lookup`` write asks the provider first; a ``none`` write never;
* ``refused`` — any other 4xx: the provider did not act on it, and the same
  request would fail again;
* ``unusable_answer`` — a success whose answer has nothing at the tool's
  response_pointer: the provider acted, so it is never sent again, and the
  call fails saying so (the tool's definition does not fit its provider).
"""

from __future__ import annotations

import enum

from executor.tools.send_errors import (
    MaybeSent,
    NotSent,
    ProviderError,
    ToolSendError,
    UnusableAnswer,
)


class Failure(enum.Enum):
    NOT_SENT = "not_sent"
    RATE_LIMITED = "rate_limited"
    KEY_IN_USE = "key_in_use"
    MAYBE_APPLIED = "maybe_applied"
    REFUSED = "refused"
    UNUSABLE_ANSWER = "unusable_answer"


def classify(exc: ToolSendError, call_class: str) -> Failure:
    """Which failure `exc` is for a call of this class."""
    if isinstance(exc, NotSent):
        return Failure.NOT_SENT
    if isinstance(exc, MaybeSent):
        return Failure.MAYBE_APPLIED
    if isinstance(exc, UnusableAnswer):
        return Failure.UNUSABLE_ANSWER
    if isinstance(exc, ProviderError):
        if exc.status == 429:
            return Failure.RATE_LIMITED
        if exc.status == 409 and call_class == "provider_key":
            return Failure.KEY_IN_USE
        if exc.status >= 500:
            return Failure.MAYBE_APPLIED
        return Failure.REFUSED
    return Failure.MAYBE_APPLIED  # an unexpected send error: assume the worst


def may_resend(call_class: str, failure: Failure) -> bool:
    """Whether the very same request (same key) may go out again right away."""
    if failure in (Failure.NOT_SENT, Failure.RATE_LIMITED, Failure.KEY_IN_USE):
        return True
    if failure is Failure.MAYBE_APPLIED:
        # Reads change nothing; provider_key writes are deduplicated by the key.
        # A lookup write is resent only after the provider said it has not got it.
        return call_class in ("read", "provider_key")
    return False
