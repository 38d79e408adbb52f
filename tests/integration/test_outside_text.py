"""A model's text that Postgres or protobuf cannot hold, through a real run.

A model server (real HTTP, in this process, OpenAI's format) answers with what a
compatible server may send: a NUL and a lone surrogate (`\\u0000`, `\\ud83d`) in the
reply's text and in a tool call's arguments, and a usage count that is NaN. Before
executor/storable.py the first decision's commit was refused (a NUL) or could not be sent
at all (a lone surrogate: the run's task ended and the run was claimed again and again).
Now the run completes (control plane and executor processes, the provider sandbox's echo):
each such character is kept as U+FFFD in the steps, the echoed text and the run's output,
and the model's second turn reads the tool's result as recorded.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from agentrun.v1 import run_pb2
from sandbox.serve import BackgroundServer
from tests.harness.agentrun_api import Api

# JSON text as the server writes it: the escapes are what reach the executor's reader.
CALL = (
    '{"id": "c1", "object": "chat.completion", "model": "odd", "choices": [{"index": 0, '
    '"finish_reason": "tool_calls", "message": {"role": "assistant", '
    '"content": "thinking\\u0000", "tool_calls": [{"id": "t1", "type": "function", '
    '"function": {"name": "echo", "arguments": "{\\"text\\": \\"a\\\\u0000b \\\\ud83d c\\"}"}}]}}], '
    '"usage": {"prompt_tokens": NaN, "completion_tokens": 3}}'
)
DONE = (
    '{"id": "c2", "object": "chat.completion", "model": "odd", "choices": [{"index": 0, '
    '"finish_reason": "stop", "message": {"role": "assistant", '
    '"content": "done \\u0000 \\ud83d"}}], "usage": {"prompt_tokens": 9, "completion_tokens": 2}}'
)
KEPT = "\ufffd"


class OddModel:
    """Answers a conversation without a tool result with CALL, one with a result with DONE;
    keeps the tool messages it was sent."""

    def __init__(self) -> None:
        self.tool_messages: list[str] = []
        app = Starlette(routes=[Route("/v1/chat/completions", self.answer, methods=["POST"])])
        self.server = BackgroundServer(app)

    async def answer(self, request: Request) -> Response:
        messages = json.loads(await request.body())["messages"]
        results = [m["content"] for m in messages if m.get("role") == "tool"]
        self.tool_messages += results
        return Response(DONE if results else CALL, media_type="application/json")


@pytest.fixture
def odd_model() -> Iterator[OddModel]:
    model = OddModel()
    with model.server:
        yield model


async def test_a_reply_with_nul_and_lone_surrogates_completes_kept_as_replacements(
    db_url, control_plane, executor_factory, odd_model
) -> None:
    cp = control_plane(db_url)
    executor_factory(cp, AGENTRUN_MODEL_BASE_URL=f"{odd_model.server.url}/v1")
    api = await Api.connect(cp.address, db_url)
    try:
        await api.publish("odd", "odd", ["echo"])
        run_id = await api.start("odd")
        [run] = await api.wait_terminal([run_id], within=30)
        assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
        assert run.output == f"done {KEPT} {KEPT}"
        steps = await api.steps(run_id)
    finally:
        await api.close()
    decision = next(s.payload for s in steps if s.kind == "model_decision")
    result = next(s.payload for s in steps if s.kind == "tool_result")
    assert decision["content"] == f"thinking{KEPT}"
    assert decision["tool_calls"][0]["arguments"] == {"text": f"a{KEPT}b {KEPT} c"}
    assert decision["usage"]["prompt_tokens"] == 0  # NaN is no count
    assert result["output"]["echo"] == f"a{KEPT}b {KEPT} c"
    # The model's next turn read the result as recorded.
    assert any(f"a{KEPT}b {KEPT} c" in message for message in odd_model.tool_messages)
