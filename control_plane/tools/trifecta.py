"""The lethal trifecta: private data, untrusted content and a way out, in one agent.

An agent whose tools read private data, read content anyone can write (an
inbound mail, a fetched page) and can send something out can be talked, by
that content, into sending the data out: nothing in the model reliably tells
instructions from data. Publishing such a set returns a warning naming the
combination and suggesting the tools to gate behind approval (or drop);
with `AGENTRUN_TRIFECTA_POLICY=acknowledge` it is refused unless the request
says `acknowledge_trifecta`. An external sender the agent's approval policy
already holds for a person closes the way out, and so does not count.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from control_plane.tools.registry import PublishWarning

PRIVATE, UNTRUSTED, EXTERNAL = "reads_private", "reads_untrusted", "communicates_externally"
POLICIES = ("warn", "acknowledge")


def warning(
    capabilities: Mapping[str, frozenset[str]], gated: Collection[str] = ()
) -> PublishWarning | None:
    """The trifecta warning for these tools (name -> capabilities), or None."""

    def holding(capability: str) -> list[str]:
        return [name for name, caps in capabilities.items() if capability in caps]

    private, untrusted = holding(PRIVATE), holding(UNTRUSTED)
    senders = [name for name in holding(EXTERNAL) if name not in gated]
    if not (private and untrusted and senders):
        return None
    message = (
        "these tools hold the lethal trifecta: private data ({}), untrusted content ({}) "
        "and external communication ({}); content the agent reads can steer it into sending "
        "private data out. Gate {} behind approval (spec.approval.tools) or drop one of them"
    ).format(", ".join(private), ", ".join(untrusted), ", ".join(senders), " and ".join(senders))
    return PublishWarning("lethal_trifecta", message, tuple(senders))
