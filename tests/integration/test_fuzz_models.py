"""Both model adapters against a provider that answers with anything (real HTTP, uvicorn).

A provider's answer is untrusted input: a compatible server with a bug, a proxy's error
page, a stream cut short. The adapters promise (executor/models/base.py ModelClient) a
ModelReply, ModelUnavailable (ask again later) or ModelRejected (the run fails with the
reason), nothing else: any other exception ends the run's task, its lease lapses, and
the next executor asks again and fails the same way until the run's deadline.

The server here answers each call, streamed or not, with a mutation of a valid OpenAI or
Anthropic answer (fields dropped, replaced with values of other types, lists where
objects were, NaN, NUL and lone surrogate escapes, huge numbers, 100 KB strings, arrays
nested 600 deep), undecodable bytes, JSON nested 50,000 deep, a
truncated body or event stream, an error status with any body, and Retry-After headers
of every shape. Each call's answer is drawn from a generator seeded by the call's run id,
so a failure names the seed that reproduces it.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from control_plane.ground import validate
from executor.models.anthropic import AnthropicMessagesModel
from executor.models.base import ModelRejected, ModelReply, ModelSettings, ModelUnavailable
from executor.models.openai import OpenAIChatModel
from executor.steps import decision
from sandbox.serve import BackgroundServer
from tests.harness.invariants import stored_payload

CALLS = 120  # per adapter, streamed and not
ECHO = {
    "type": "function",
    "function": {
        "name": "echo",
        "description": "Echo text.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
    },
}
USAGE = {
    "prompt_tokens": 5,
    "completion_tokens": 3,
    "total_tokens": 8,
    "prompt_tokens_details": {"cached_tokens": 1},
    "completion_tokens_details": {"reasoning_tokens": 1},
}
OPENAI = {
    "id": "c1",
    "object": "chat.completion",
    "model": "m",
    "usage": USAGE,
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": "hi",
                "refusal": None,
                "tool_calls": [
                    {
                        "id": "t1",
                        "type": "function",
                        "function": {"name": "echo", "arguments": '{"text": "x"}'},
                    }
                ],
            },
        }
    ],
}
ANTHROPIC = {
    "id": "m1",
    "type": "message",
    "role": "assistant",
    "model": "m",
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "content": [
        {"type": "thinking", "thinking": "hmm", "signature": "s"},
        {"type": "text", "text": "hi"},
        {"type": "tool_use", "id": "t1", "name": "echo", "input": {"text": "x"}},
    ],
    "usage": {
        "input_tokens": 5,
        "output_tokens": 3,
        "cache_read_input_tokens": 1,
        "cache_creation_input_tokens": 1,
    },
}
OPENAI_CHUNKS = [
    {"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "h"}}]},
    {
        "id": "c",
        "choices": [
            {
                "index": 0,
                "delta": {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "t1",
                            "type": "function",
                            "function": {"name": "echo", "arguments": '{"te'},
                        }
                    ]
                },
            }
        ],
    },
    {
        "id": "c",
        "choices": [
            {
                "index": 0,
                "delta": {"tool_calls": [{"index": 0, "function": {"arguments": 'xt": "x"}'}}]},
            }
        ],
    },
    {
        "id": "c",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
        "usage": USAGE,
    },
]
ANTHROPIC_EVENTS = [
    {"type": "message_start", "message": {**ANTHROPIC, "content": [], "stop_reason": None}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
    {"type": "content_block_stop", "index": 0},
    {
        "type": "content_block_start",
        "index": 1,
        "content_block": {"type": "tool_use", "id": "t1", "name": "echo", "input": {}},
    },
    {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": '{"text": '},
    },
    {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": '"x"}'},
    },
    {"type": "content_block_stop", "index": 1},
    {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 3}},
    {"type": "message_stop"},
]
STATUSES = (200,) * 10 + (400, 401, 404, 408, 429, 500, 503, 529, 302, 418)
RETRY_AFTER = ("1", "-5", "abc", "1e999", "nan", "99999999999", "Wed, 21 Oct 2015 07:28:00 GMT")
CONTENT_TYPES = ("application/json",) * 4 + (
    "text/html",
    "",
    "application/json; charset=latin-1",
    "text/plain; charset=no-such-charset",
)


class Hostile:
    """Values and mutations of one call's answer, from its own seed."""

    def __init__(self, seed: str) -> None:
        self.rng = random.Random(seed)

    def value(self, depth: int = 0) -> Any:
        pick = self.rng.randrange(10)
        if pick == 0:
            return None
        if pick == 1:
            return self.rng.choice([0, -1, 10**30, 1.5, 2**63, float("nan"), float("inf")])
        if pick == 2:
            return self.rng.choice(["", "x", "a\x00b", "é\u2028", "\ud83d", "{", "null", "NaN"])
        if pick == 3:
            return self.rng.choice([True, False])
        if pick == 4 and depth < 3:
            return [self.value(depth + 1) for _ in range(self.rng.randrange(3))]
        if pick == 5 and depth < 3:
            keys = ("type", "text", "id", "name", "input", "arguments", "function", "index")
            return {self.rng.choice(keys): self.value(depth + 1) for _ in range(3)}
        if pick == 6:
            return "x" * 100_000
        if pick == 7:  # deeper than a step may nest
            deep: Any = "bottom"
            for _ in range(600):
                deep = [deep]
            return deep
        return self.rng.choice([{}, [], "", 0])

    def mutated(self, obj: Any) -> Any:
        """`obj` with some fields dropped, some replaced by any value, some lists grown."""
        if isinstance(obj, dict):
            out = {}
            for key, value in obj.items():
                roll = self.rng.random()
                if roll < 0.07:
                    continue
                out[key] = self.value() if roll < 0.14 else self.mutated(value)
            return out
        if isinstance(obj, list):
            out_list = [self.mutated(v) for v in obj if self.rng.random() > 0.07]
            if self.rng.random() < 0.1:
                out_list.append(self.value())
            return out_list
        return self.value() if self.rng.random() < 0.08 else obj

    def document(self, valid: Any) -> bytes:
        roll = self.rng.random()
        if roll < 0.75:  # NaN and Infinity written as Python writes them
            return json.dumps(self.mutated(valid)).encode()
        if roll < 0.85:
            return self.rng.randbytes(self.rng.randrange(60))
        if roll < 0.92:
            return json.dumps({"error": self.value()}).encode()
        if roll < 0.95:  # deeper than Python's JSON reader goes
            return b"[" * 50_000 + b"]" * 50_000
        return json.dumps(valid)[: self.rng.randrange(200)].encode()

    def events(self, api: str) -> bytes:
        lines: list[bytes] = []
        for event in OPENAI_CHUNKS if api == "openai" else ANTHROPIC_EVENTS:
            if self.rng.random() < 0.05:
                continue
            if api == "anthropic":
                lines.append(f"event: {event['type']}".encode())
            data = json.dumps(self.mutated(event)).encode()
            garbled = self.rng.random() < 0.04
            lines += [b"data: " + (self.rng.randbytes(8) if garbled else data), b""]
        if api == "openai":
            lines.append(b"data: [DONE]")
        if self.rng.random() < 0.2:  # the stream breaks off
            lines = lines[: self.rng.randrange(len(lines) + 1)]
        return b"\n".join(lines) + b"\n\n"


async def _answer(request: Request) -> Response:
    api = "openai" if request.url.path.endswith("/chat/completions") else "anthropic"
    asked = json.loads(await request.body())
    hostile = Hostile(request.headers.get("x-agentrun-run-id", ""))
    status = hostile.rng.choice(STATUSES)
    headers = {"retry-after": hostile.rng.choice(RETRY_AFTER)} if hostile.rng.random() < 0.2 else {}
    if asked.get("stream") and status == 200 and hostile.rng.random() < 0.9:
        kind = hostile.rng.choice(["text/event-stream"] * 3 + ["application/json"])
        return Response(hostile.events(api), status, headers, media_type=kind)
    body = hostile.document(OPENAI if api == "openai" else ANTHROPIC)
    return Response(body, status, headers, media_type=hostile.rng.choice(CONTENT_TYPES))


@pytest.fixture(scope="module")
def provider() -> Iterator[BackgroundServer]:
    app = Starlette(routes=[Route("/{path:path}", _answer, methods=["POST"])])
    with BackgroundServer(app) as running:
        yield running


def _adapter(provider: BackgroundServer, api: str) -> Any:
    if api == "openai":
        return OpenAIChatModel(f"{provider.url}/v1", "sk-fuzz", 5.0)
    return AnthropicMessagesModel(provider.url, "sk-fuzz", 5.0)


def _storable(reply: ModelReply) -> None:
    """The decision the executor records for `reply` is one the control plane stores, and
    each text of it can go in a stream message and a text column (a run's output, its
    error): UTF-8 without NUL."""
    texts = [reply.content or "", reply.refusal or "", reply.stop_reason, reply.model]
    for call in reply.tool_calls:
        assert isinstance(call.id, str) and isinstance(call.name, str), call
        assert isinstance(call.arguments, dict) or isinstance(call.arguments_raw, str), call
        texts += [call.id, call.name, call.arguments_raw or ""]
    assert reply.content is None or isinstance(reply.content, str), reply
    for text in texts:
        validate.text("text", text.encode("utf-8").decode(), max_bytes=10**7)
    step = decision(3, reply, "m")
    stored_payload(step.payload_json)


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_any_answer_is_a_reply_or_a_model_failure(provider, api, streamed) -> None:
    outcomes: Counter[str] = Counter()
    wrong: list[str] = []
    settings = ModelSettings(on_delta=(lambda text: None) if streamed else None)
    model = _adapter(provider, api)
    try:
        for n in range(CALLS):
            seed = f"{api}-{streamed}-{n}"
            try:
                reply = await model.complete(
                    "m", [{"role": "user", "content": "hi"}], [ECHO], seed, 1, settings=settings
                )
            except (ModelUnavailable, ModelRejected) as exc:
                outcomes[type(exc).__name__] += 1
                assert exc.args[0] and "sk-fuzz" not in exc.args[0], exc.args
                continue
            except Exception as exc:  # noqa: BLE001 - what this test is for
                wrong.append(f"seed {seed!r}: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            outcomes["reply"] += 1
            try:
                _storable(reply)
            except (AssertionError, UnicodeEncodeError, validate.InvalidArgument) as exc:
                wrong.append(f"seed {seed!r}: reply not storable: {str(exc)[:300]}")
    finally:
        await model.aclose()
    assert not wrong, "\n".join(wrong[:20])
    # The answers reach every way out: some replies, some of each failure.
    assert outcomes["reply"] >= CALLS // 10, outcomes
    assert outcomes["ModelUnavailable"] >= CALLS // 10, outcomes
    assert outcomes["ModelRejected"] >= 1, outcomes
