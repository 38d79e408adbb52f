"""Streamed model calls (the fast path): the sandbox streams as OpenAI and Anthropic do, and
each adapter tells each piece of text as it comes and assembles the same reply as unstreamed."""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace

import pytest

from executor.models.anthropic import AnthropicMessagesModel
from executor.models.base import ModelRejected, ModelSettings, ModelUnavailable
from executor.models.openai import OpenAIChatModel
from sandbox import anthropic_api
from sandbox.model_server import create_app
from sandbox.prompt_cache import CacheUse
from sandbox.scenario import RenderedCall, Reply
from sandbox.serve import BackgroundServer
from tests.harness.http_stub import Seen, reply, serving

MESSAGES = [{"role": "user", "content": "hi"}]


@contextlib.contextmanager
def served(*apps) -> Iterator[list[str]]:
    """The sandbox apps on real ports, from threads of this process."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(BackgroundServer(app)).url for app in apps]


@contextlib.asynccontextmanager
async def closing(model):
    try:
        yield model
    finally:
        await model.aclose()


def openai_at(url: str) -> OpenAIChatModel:
    return OpenAIChatModel(f"{url}/v1", "")


def anthropic_at(url: str) -> AnthropicMessagesModel:
    return AnthropicMessagesModel(url, "")


@contextlib.asynccontextmanager
async def anthropic_answering(handler) -> AsyncIterator[AnthropicMessagesModel]:
    async with serving(handler) as stub, closing(anthropic_at(stub.url)) as model:
        yield model


@pytest.mark.parametrize("scenario", ["fast_chat", "fast_mail", "chat"])
async def test_a_streamed_reply_is_the_unstreamed_reply_told_piece_by_piece(scenario):
    app = create_app()
    pieces: list[str] = []
    with served(app) as (url,):
        async with closing(openai_at(url)) as model:
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
    def cut(request: Seen):
        return reply(text='data: {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}\r\n\r\n')

    told: list[str] = []
    settings = ModelSettings(on_delta=told.append)
    async with serving(cut) as stub, closing(openai_at(stub.url)) as model:
        with pytest.raises(ModelUnavailable, match="ended before the reply did"):
            await model.complete("m", MESSAGES, [], "r", 1, settings=settings)
    assert told == ["Hi"]
    with served(create_app()) as (url,):
        async with closing(openai_at(url)) as model:
            with pytest.raises(ModelRejected, match="does not exist"):
                await model.complete("no_such_scenario", MESSAGES, [], "r", 1, settings=settings)


async def test_a_streamed_line_may_be_longer_than_aiohttp_reads_a_line():
    """A chunk of 300 KiB of text in one event (aiohttp's own line reader stops at 128 KiB)."""
    long = "x" * 300_000
    events = [
        {"choices": [{"index": 0, "delta": {"content": long}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    told: list[str] = []
    async with serving(lambda r: reply(text=text)) as stub, closing(openai_at(stub.url)) as model:
        answer = await model.complete(
            "m", MESSAGES, [], "r", 1, settings=ModelSettings(on_delta=told.append)
        )
    assert told == [long] and answer.content == long


@pytest.mark.parametrize("scenario", ["fast_chat", "fast_mail", "bad_tool", "refuses", "cut_off"])
async def test_a_streamed_anthropic_message_is_the_unstreamed_one_told_piece_by_piece(scenario):
    # Two servers playing the same dice: the same nonces in the same turns.
    app, twin = create_app(rng=random.Random(7)), create_app(rng=random.Random(7))
    pieces: list[str] = []
    with served(app, twin) as (url, twin_url):
        async with closing(anthropic_at(url)) as model:
            streamed = await model.complete(
                scenario, MESSAGES, [], "run-1", 1, settings=ModelSettings(on_delta=pieces.append)
            )
        async with closing(anthropic_at(twin_url)) as model:
            whole = await model.complete(scenario, MESSAGES, [], "run-1", 1)
    (log,) = app.state.sandbox.log.entries()
    assert log["stream"] == "events" and "stream" not in twin.state.sandbox.log.entries()[0]
    assert streamed.response_id == log["response_id"] and whole.response_id != ""
    # The same decision but for the ids the server made up for each answer.
    ids = {"response_id": "", "tool_calls": tuple(replace(c, id="") for c in whole.tool_calls)}
    same = {"response_id": "", "tool_calls": tuple(replace(c, id="") for c in streamed.tool_calls)}
    assert replace(streamed, **same) == replace(whole, **ids)
    assert "".join(pieces) == (streamed.content or "")
    assert len(pieces) > 1 or not whole.content


async def test_an_anthropic_stream_assembles_exactly_the_message_it_streams():
    """Every field of the reply, ids and usage included, from the same message both ways."""
    body = anthropic_api.message_response(
        "m",
        Reply(content="Two words.", tool_calls=(RenderedCall("echo", '{"text": "x"}'),)),
        CacheUse(total=40, read=30, written=10),
        7,
    )

    def answer(request: Seen):
        if request.json().get("stream"):
            events = anthropic_api.message_events(body)
            text = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)
            return reply(text=text, headers={"Content-Type": "text/event-stream"})
        return reply(json=body)

    told: list[str] = []
    async with anthropic_answering(answer) as model:
        streamed = await model.complete(
            "m", MESSAGES, [], "r", 1, settings=ModelSettings(on_delta=told.append)
        )
        assert streamed == await model.complete("m", MESSAGES, [], "r", 1)
    assert told == ["Two", " words."] and streamed.tool_calls[0].arguments == {"text": "x"}
    assert (streamed.usage.prompt_tokens, streamed.usage.completion_tokens) == (40, 7)


async def test_an_anthropic_stream_cut_short_or_failing_midway_is_unavailable():
    start = {"type": "message_start", "message": {"id": "msg_1", "content": [], "usage": {}}}
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
    for events, reason in (
        ([start], "ended before the reply did"),
        ([start, overloaded], "overloaded_error"),
    ):
        text = "".join(f"data: {json.dumps(e)}\n\n" for e in events)
        async with anthropic_answering(lambda r, t=text: reply(text=t)) as model:
            with pytest.raises(ModelUnavailable, match=reason):
                await model.complete(
                    "m", MESSAGES, [], "r", 1, settings=ModelSettings(on_delta=lambda t: None)
                )
