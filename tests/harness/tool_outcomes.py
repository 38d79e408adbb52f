"""What a fuzzed tool client's calls came to (tests/integration/test_fuzz_tools.py, _mcp.py).

A tool client promises the provider's result or a ToolSendError, and whichever it is goes
into a `tool_result` step the control plane must accept:

    outcomes = ToolOutcomes()
    failure = await outcomes.judge(seed, "crm_lookup", client.send(...))
    assert not outcomes.wrong; outcomes.counts["result"], outcomes.counts["NotSent"], ...
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable
from typing import Any

from control_plane.ground import validate
from executor.steps import tool_result
from executor.tools.send_errors import ToolSendError
from tests.harness.invariants import stored_payload


class ToolOutcomes:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()  # "result", or the ToolSendError's class
        self.wrong: list[str] = []  # each broken promise, with the seed that reproduces it

    async def judge(self, seed: str, tool: str, call: Awaitable[Any]) -> ToolSendError | None:
        """Await one call; its ToolSendError, if it raised one."""
        failure = None
        try:
            output = await call
        except ToolSendError as exc:
            self.counts[type(exc).__name__] += 1
            step, failure = tool_result(5, 4, "c1", tool, "error", error=str(exc)), exc
        except Exception as exc:  # noqa: BLE001 - what the fuzz tests are for
            self.wrong.append(f"seed {seed!r}: {type(exc).__name__}: {str(exc)[:200]}")
            return None
        else:
            self.counts["result"] += 1
            step = tool_result(5, 4, "c1", tool, "ok", output=output)
        try:
            stored_payload(step.payload_json)
        except validate.InvalidArgument as exc:
            self.wrong.append(f"seed {seed!r}: result not storable: {exc}")
        return failure
