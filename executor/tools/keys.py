"""Idempotency keys: derived from the step, and only as good as the provider's retention.

A tool call's key is ``<run_id>:<seq>``, the seq of its ``tool_started`` step,
so every retry of that step carries the same key and a new attempt (a new
step) gets a new one. Providers forget keys after a while (Stripe keeps them
at least 24 h); a key older than its provider's retention no longer protects
anything, so its unknown outcome is resolved as class ``none``. The age is
measured from the step's creation time (database clock) to the executor's
clock, with a safety margin for skew and for the time the retry itself takes.
"""

from __future__ import annotations

from dataclasses import dataclass

from executor.tools.catalogue import Tool

# A key is treated as expired this much before its provider forgets it.
EXPIRY_MARGIN_FRACTION = 0.05
# Classes whose protection depends on the provider remembering the key.
KEYED_CLASSES = ("provider_key", "lookup")


def derive(run_id: str, seq: int) -> str:
    """The idempotency key of the tool call started at `seq`."""
    return f"{run_id}:{seq}"


def expired(age_seconds: float, retention_hours: float | None) -> bool:
    """Whether a key this old may already be forgotten (None retention: never)."""
    if retention_hours is None:
        return False
    usable = retention_hours * 3600.0 * (1.0 - EXPIRY_MARGIN_FRACTION)
    return age_seconds >= usable


@dataclass(frozen=True)
class ResolutionClass:
    """The class an unknown outcome is resolved by, and why it is weaker than recorded."""

    name: str
    downgraded_because: str | None = None


def resolution_class(tool: Tool | None, recorded: str, key_age_seconds: float) -> ResolutionClass:
    """How to resolve a started call with no result, found on resume.

    The class recorded in `tool_started` is used only if today's catalogue
    still agrees with it and, for keyed classes, the key is still remembered;
    otherwise the call is resolved as `none`: not sent, a person decides.
    """
    if recorded == "internal":
        return ResolutionClass("internal")
    if tool is None:
        return ResolutionClass("none", "the tool is no longer in the catalogue")
    if tool.call_class != recorded:
        why = f"the catalogue now says class {tool.call_class}, the call was sent as {recorded}"
        return ResolutionClass("none", why)
    if recorded in KEYED_CLASSES and expired(key_age_seconds, tool.key_retention_hours):
        hours = key_age_seconds / 3600.0
        why = (
            f"the key is {hours:.1f} h old and {tool.provider} keeps keys "
            f"{tool.key_retention_hours:g} h"
        )
        return ResolutionClass("none", why)
    return ResolutionClass(recorded)
