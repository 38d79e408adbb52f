"""The chain marker on mail an agent sends, so agent-to-agent loops stop on the receiving side.

Mail sent by a run carries `X-Agentrun-Origin: agentrun` and
`X-Agentrun-Chain-Depth: <the run's depth + 1>` (and, where the executor
knows it, `X-Agentrun-Installation`). A run's depth is 0 unless an inbound
mail carrying the marker started it: then it is that mail's depth, recorded
in the run's input step as `trigger.chain_depth`. The receiving side
(control_plane/triggers/mail.py, of this installation or another) reads the
depth from the message alone and starts no run past its trigger's
`max_chain_depth`, whether or not the sending run is in its database.

The headers go where the tool's provider keeps a message's headers (the
catalogue's `chain_marker` body field), beside the lookup key stamp; they are
not part of the recorded arguments (the model never chose them), and a
resend stamps the same ones: the depth comes from the log.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from agentrun.v1 import run_pb2
from executor.tools.catalogue import Tool

# The same names control_plane/triggers/mail.py reads (tests/unit checks they agree).
MARKER_HEADER = "X-Agentrun-Origin"
MARKER_VALUE = "agentrun"
DEPTH_HEADER = "X-Agentrun-Chain-Depth"
INSTALLATION_HEADER = "X-Agentrun-Installation"


def run_depth(steps: Iterable[run_pb2.Step]) -> int:
    """The run's chain depth, from its input step (0 when no marked mail started it)."""
    for step in steps:
        if step.kind != run_pb2.STEP_KIND_INPUT:
            continue
        try:
            payload = json.loads(step.payload_json or "{}")
        except ValueError:
            return 0
        trigger = payload.get("trigger") if isinstance(payload, dict) else None
        depth = trigger.get("chain_depth") if isinstance(trigger, dict) else None
        return depth if isinstance(depth, int) and depth >= 0 else 0
    return 0


def headers(depth: int, installation: str = "") -> dict[str, str]:
    """The marker mail sent by a run at `depth` carries."""
    marked = {MARKER_HEADER: MARKER_VALUE, DEPTH_HEADER: str(depth + 1)}
    if installation:
        marked[INSTALLATION_HEADER] = installation
    return marked


def stamp(
    tool: Tool, arguments: Mapping[str, Any], depth: int, installation: str = ""
) -> Mapping[str, Any]:
    """The request body for `tool`: with the chain marker where its provider keeps headers."""
    if tool.chain_marker is None:
        return arguments
    field = arguments.get(tool.chain_marker)
    kept = dict(field) if isinstance(field, Mapping) else {}
    return {**arguments, tool.chain_marker: {**kept, **headers(depth, installation)}}
