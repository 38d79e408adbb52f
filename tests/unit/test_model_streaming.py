"""Streamed chat completions (the fast path): the sandbox streams as OpenAI does, and the
adapter tells each piece of text as it comes and assembles the same reply as unstreamed."""

from __future__ import annotations

import httpx
import pytest

from executor.models.base import ModelRejected, ModelSettings, ModelUnavailable
from executor.models.openai import OpenAIChatModel
from sandbox.model_server import create_app

MESSAGES = [{"role": "user", "content": "hi"}]


def model_on(app) -> OpenAIChatModel:
    return OpenAIChatModel("http://model.test/v1", "", transport=httpx.ASGITransport(app=app))


@pytest.mark.parametrize("scenario", ["fast_chat", "fast_mail", "chat"])
async def test_a_streamed_reply_is_the_unstreamed_reply_told_piece_by_piece(scenario):
    app = create_app()
    model = model_on(app)
    pieces: list[str] = []
    streamed = await model.complete(
        scenario, MESSAGES, [], "run-1", 1, settings=ModelSettings(on_delta=pieces.append)
    )
    whole = await model.complete(scenario, MESSAGES, [], "run-1", 1)
    assert "".join(pieces) == (streamed.content or "") == (whole.content or "")
    assert len(pieces) > 1 or not whole.content  # in pieces, not one blob
    assert [(c.name, c.arguments is not None) for c in streamed.tool_calls] == [
        (c.name, c.arguments is not None) for c in whole.tool_calls
    ]
    assert (streamed.ending, streamed.stop_reason) == (whole.ending, whole.stop_reason)
    assert streamed.usage.prompt_tokens == whole.usage.prompt_tokens > 0
    log = app.state.sandbox.log.entries()
    assert [e.get("stream") for e in log] == ["usage", None]
    assert streamed.response_id == log[0]["response_id"]
    assert all(e["received_at"] <= e["time"] for e in log)


async def test_a_stream_cut_short_is_unavailable_and_an_error_answer_is_read_whole():
    def cut(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, text='data: {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}\n\n'
        )

    told: list[str] = []
    settings = ModelSettings(on_delta=told.append)
    model = OpenAIChatModel("http://model.test/v1", "", transport=httpx.MockTransport(cut))
    with pytest.raises(ModelUnavailable, match="ended before the reply did"):
        await model.complete("m", MESSAGES, [], "r", 1, settings=settings)
    assert told == ["Hi"]
    with pytest.raises(ModelRejected, match="does not exist"):
        await model_on(create_app()).complete("no_such_scenario", MESSAGES, [], "r", 1,
                                              settings=settings)  # fmt: skip
