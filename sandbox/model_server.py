"""A model server that plays scenario files: OpenAI chat completions (`/v1/chat/completions`)
and the Anthropic Messages API (`/v1/messages`, sandbox/anthropic_api.py), one scenario
file serving both. Usage reports cached tokens from a stand-in prompt cache
(sandbox/prompt_cache.py), or what the scenario turn says.

A chat completion asked with `"stream": true` is answered as OpenAI streams one
(server-sent events: `chat.completion.chunk`s, the content a word or so at a time,
each tool call whole, the finish, the usage when `stream_options.include_usage`,
then `[DONE]`), a turn's `stream_chunk_ms` apart; a Messages API request with
`"stream": true` as Anthropic streams one (sandbox/anthropic_api.py `message_events`),
its text deltas as far apart. Each log entry says when the request arrived
(`received_at`, wall clock) and whether it streamed (`usage`/`plain`: chat
completions, `events`: Messages)."""

import asyncio
import hashlib
import json
import random
import re
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from sandbox import anthropic_api, summaries
from sandbox.faults import FaultSpecError, ModelFaults, retry_after_headers
from sandbox.json_http import JSONResponse, read_json
from sandbox.prompt_cache import CacheUse, PromptCache
from sandbox.request_log import RequestLog
from sandbox.scenario import (
    DEFAULT_DIR,
    Reply,
    Scenario,
    ScenarioError,
    ScenarioStore,
    UnknownScenario,
    render_turn,
)

RUN_ID_HEADER = "x-agentrun-run-id"
SEQ_HEADER = "x-agentrun-seq"


class _Refused(Exception):
    """A request answered with an OpenAI-style error instead of a completion."""

    def __init__(
        self, status: int, message: str, kind: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
        self.headers = headers or {}

    def response(self, api: str = "openai") -> JSONResponse:
        if api == "anthropic":
            body = anthropic_api.error_body(self.status, self.message, self.kind)
            status = anthropic_api.error_status(self.status, self.kind)
            return JSONResponse(body, status_code=status, headers=self.headers)
        code = self.kind if self.kind == "insufficient_quota" else None
        body = {"error": {"message": self.message, "type": self.kind, "param": None, "code": code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)

    @classmethod
    def scripted(cls, error: dict[str, Any]) -> "_Refused":
        """The error a scenario turn answers with."""
        status = int(error["status"])
        message = str(error.get("message") or f"sandbox scenario error ({status})")
        kind = str(
            error.get("type") or ("server_error" if status >= 500 else "invalid_request_error")
        )
        return cls(status, message, kind, dict(error.get("headers") or {}))


class ModelSandbox:
    """State of one model server: scenarios, request log, armed faults, optional API key."""

    def __init__(
        self,
        scenarios_dir: Path | Sequence[Path] = DEFAULT_DIR,
        api_key: str | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.scenarios = ScenarioStore(scenarios_dir)
        self.api_key = api_key
        self.rng = rng or random.Random()
        self.log = RequestLog()
        self.faults = ModelFaults()
        self.cache = PromptCache(_estimate_tokens)

    def routes(self) -> list[Route]:
        return [
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/messages", self.messages, methods=["POST"]),
            Route("/v1/models", self.list_models, methods=["GET"]),
            Route("/_sandbox/requests", self.requests, methods=["GET", "DELETE"]),
            Route("/_sandbox/faults", self.faults_endpoint, methods=["GET", "POST", "DELETE"]),
            Route("/healthz", healthz, methods=["GET"]),
        ]

    async def chat_completions(self, request: Request) -> Response:
        return await self._serve(request, "openai", self._complete)

    async def messages(self, request: Request) -> Response:
        return await self._serve(request, "anthropic", self._message)

    async def _serve(self, request: Request, api: str, answer: Any) -> Response:
        # Filled in as the request is understood, so refused requests are logged too.
        entry: dict[str, Any] = {
            "model": None,
            "run_id": request.headers.get(RUN_ID_HEADER),
            "seq": _int_or_none(request.headers.get(SEQ_HEADER)),
            "n_messages": None,
            "turn": None,
            "response_id": None,
            "api": api,
            "received_at": time.time(),
        }
        try:
            answered = await answer(request, entry)
            pause = entry.pop("stream_chunk_ms", 0) / 1000.0
            stream = entry.get("stream")
            response: Response = (
                JSONResponse(answered)
                if not stream
                else anthropic_streamed(answered, pause)
                if api == "anthropic"
                else streamed(answered, pause, stream == "usage")
            )
        except _Refused as refused:
            entry.pop("stream_chunk_ms", None)
            response = refused.response(api)
        self.log.record(**entry, status=response.status_code)
        return response

    async def _complete(self, request: Request, entry: dict[str, Any]) -> dict[str, Any]:
        self._check_api_key(request)
        body = await read_json(request)
        model, messages = _parse_chat_request(body)
        entry["params"] = sent_params(body)
        if body.get("stream") is True:
            options = body.get("stream_options")
            usage = isinstance(options, dict) and options.get("include_usage") is True
            entry["stream"] = "usage" if usage else "plain"
        reply = await self._play(model, messages, entry, body.get("tools"))
        use = self.cache.use(messages, range(1, len(messages) + 1))
        completion = chat_completion(model, reply, messages, use)
        entry["response_id"] = completion["id"]
        return completion

    async def _message(self, request: Request, entry: dict[str, Any]) -> dict[str, Any]:
        self._check_anthropic_key(request)
        body = await read_json(request)
        try:
            model, messages, parts, breakpoints = anthropic_api.parse_request(body)
        except anthropic_api.InvalidRequest as exc:
            raise _Refused(400, str(exc), "invalid_request_error") from None
        entry["params"] = sent_params(body)
        entry["cache_breakpoints"] = len(breakpoints)
        if body.get("stream") is True:
            entry["stream"] = "events"
        reply = await self._play(model, messages, entry, body.get("tools"))
        use = self.cache.use(parts, breakpoints)
        output = _estimate_tokens(
            json.dumps([reply.content, [c.arguments for c in reply.tool_calls]])
        )
        message = anthropic_api.message_response(model, reply, use, output)
        entry["response_id"] = message["id"]
        return message

    async def _play(
        self, model: str, messages: list[dict[str, Any]], entry: dict[str, Any], tools: Any
    ) -> Reply:
        """The scenario's turn for this conversation (an error turn raises it)."""
        entry.update(model=model, n_messages=len(messages), **last_tool_seen(messages))
        await self._apply_faults()
        scenario = self._scenario(model)
        entry.update(summaries.log_fields(scenario, messages, tools))
        if latency := scenario.latency_seconds(self.rng):
            await asyncio.sleep(latency)
        try:
            reply = self._reply(scenario, messages, entry)
        except ScenarioError as exc:
            raise _Refused(500, str(exc), "server_error") from None
        if reply.error is not None:
            raise _Refused.scripted(reply.error)
        return reply

    def _reply(
        self, scenario: Scenario, messages: list[dict[str, Any]], entry: dict[str, Any]
    ) -> Reply:
        """A recap for a summarisation request; else the scenario's turn (a recap in the
        messages stands for the assistant turns it replaced)."""
        if summaries.is_request(messages):
            return summaries.recap(scenario, messages, self.rng)
        recapped = summaries.turns_recapped(messages)
        entry["turn"] = turn = scenario.turn_index(messages, recapped)
        entry["stream_chunk_ms"] = float(scenario.turns[turn].get("stream_chunk_ms") or 0)
        return render_turn(scenario.turns[turn], messages, self.rng)

    def _check_api_key(self, request: Request) -> None:
        if self.api_key is None:
            return
        if request.headers.get("authorization") != f"Bearer {self.api_key}":
            raise _Refused(401, "Incorrect or missing API key.", "invalid_request_error")

    def _check_anthropic_key(self, request: Request) -> None:
        if not request.headers.get("anthropic-version"):
            raise _Refused(400, "anthropic-version: header is required", "invalid_request_error")
        if self.api_key is not None and request.headers.get("x-api-key") != self.api_key:
            raise _Refused(401, "invalid x-api-key", "authentication_error")

    async def _apply_faults(self) -> None:
        faults = self.faults
        if faults.delay_ms:
            await asyncio.sleep(faults.delay_ms / 1000.0)
        status, retry_after = faults.status, faults.retry_after
        if faults.take_down():
            kind = "rate_limit_error" if status == 429 else "server_error"
            message = f"sandbox fault: model server is down ({status})"
            raise _Refused(status, message, kind, retry_after_headers(retry_after))

    def _scenario(self, model: str) -> Scenario:
        try:
            return self.scenarios.get(model)
        except UnknownScenario:
            message = f"The model `{model}` does not exist (no scenario file {model}.json)."
            raise _Refused(404, message, "invalid_request_error") from None
        except ScenarioError as exc:
            raise _Refused(500, str(exc), "server_error") from None

    async def list_models(self, request: Request) -> Response:
        models = [
            {"id": name, "object": "model", "owned_by": "sandbox"}
            for name in self.scenarios.names()
        ]
        return JSONResponse({"object": "list", "data": models})

    async def requests(self, request: Request) -> Response:
        if request.method == "DELETE":
            self.log.clear()
        return JSONResponse({"requests": self.log.entries()})

    async def faults_endpoint(self, request: Request) -> Response:
        if request.method == "POST":
            try:
                self.faults = ModelFaults.from_json(await read_json(request))
            except FaultSpecError as exc:
                return JSONResponse({"error": str(exc)}, status_code=400)
        elif request.method == "DELETE":
            self.faults = ModelFaults()
        return JSONResponse(self.faults.to_json())


def create_app(
    scenarios_dir: Path | str | Sequence[Path] | None = None,
    api_key: str | None = None,
    rng: random.Random | None = None,
) -> Starlette:
    """The model sandbox app; its state is reachable as `app.state.sandbox`."""
    dirs = [Path(scenarios_dir)] if isinstance(scenarios_dir, str | Path) else scenarios_dir
    sandbox = ModelSandbox(dirs or DEFAULT_DIR, api_key=api_key, rng=rng)
    app = Starlette(routes=sandbox.routes())
    app.state.sandbox = sandbox
    return app


def chat_completion(
    model: str, reply: Reply, messages: list[dict[str, Any]], use: CacheUse | None = None
) -> dict[str, Any]:
    """A reply in the OpenAI `chat.completion` wire format."""
    refused = reply.refusal is not None
    message: dict[str, Any] = {
        "role": "assistant",
        "content": None if refused else reply.content,
        "refusal": reply.refusal,
    }
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": f"call_{uuid.uuid4().hex}",
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in reply.tool_calls
        ]
    usage = _chat_usage(
        reply, _estimate_tokens(json.dumps(messages)), _estimate_tokens(json.dumps(message)), use
    )
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "finish_reason": finish_reason(reply),
                "message": message,
            }
        ],
        "usage": usage,
    }


def chat_chunks(completion: dict[str, Any], usage: bool) -> list[dict[str, Any]]:
    """A `chat.completion` as the `chat.completion.chunk`s OpenAI streams it in."""
    choice = completion["choices"][0]
    message = choice["message"]
    head = {
        "id": completion["id"],
        "object": "chat.completion.chunk",
        "created": completion["created"],
        "model": completion["model"],
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [
        chunk({"content": piece}) for piece in re.findall(r"\s*\S+", message["content"] or "")
    ]
    if message.get("refusal"):
        chunks.append(chunk({"refusal": message["refusal"]}))
    for index, call in enumerate(message.get("tool_calls") or []):
        chunks.append(chunk({"tool_calls": [{"index": index, **call}]}))
    chunks.append(chunk({}, choice["finish_reason"]))
    if usage:
        chunks.append({**head, "choices": [], "usage": completion["usage"]})
    return chunks


def streamed(completion: dict[str, Any], pause: float, usage: bool) -> StreamingResponse:
    """The completion as a server-sent event stream, `pause` seconds between text pieces."""

    async def events() -> AsyncIterator[str]:
        for chunk in chat_chunks(completion, usage):
            if pause and chunk["choices"] and "content" in chunk["choices"][0]["delta"]:
                await asyncio.sleep(pause)
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def anthropic_streamed(message: dict[str, Any], pause: float) -> StreamingResponse:
    """A Messages API response as its event stream, `pause` seconds between text deltas."""

    async def events() -> AsyncIterator[str]:
        for event in anthropic_api.message_events(message):
            if pause and event.get("delta", {}).get("type") == "text_delta":
                await asyncio.sleep(pause)
            yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


_FINISH = {
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
}


def finish_reason(reply: Reply) -> str:
    if reply.finish_reason:
        return reply.finish_reason
    if reply.stop_reason in _FINISH:
        return _FINISH[reply.stop_reason]
    return "tool_calls" if reply.tool_calls else "stop"


def _chat_usage(reply: Reply, prompt: int, completion: int, use: CacheUse | None) -> dict[str, Any]:
    """OpenAI usage: cached tokens are part of the prompt, reasoning ones of the completion."""
    given = reply.usage or {}
    prompt = given.get("prompt_tokens", prompt)
    reasoning = given.get("reasoning_tokens", 0)
    completion = given.get("completion_tokens", completion + reasoning)
    cached = min(prompt, given.get("cached_tokens", use.read if use else 0))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }


# The request fields a log entry keeps (`params`): what tunes the call, not the prompt.
PARAMS = (
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "tool_choice",
    "parallel_tool_calls",
)


def sent_params(body: dict[str, Any]) -> dict[str, Any]:
    return {key: body[key] for key in PARAMS if key in body}


def last_tool_seen(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """What the model was shown as the last tool result: its size and SHA-256 (the text
    itself would make the log grow with every large result)."""
    tools = [m for m in messages if m.get("role") == "tool"]
    if not tools:
        return {"last_tool_bytes": None, "last_tool_sha256": None}
    text = tools[-1].get("content")
    data = (text if isinstance(text, str) else json.dumps(text)).encode()
    return {"last_tool_bytes": len(data), "last_tool_sha256": hashlib.sha256(data).hexdigest()}


def _parse_chat_request(body: Any) -> tuple[str, list[dict[str, Any]]]:
    if not isinstance(body, dict):
        raise _Refused(400, "The request body must be a JSON object.", "invalid_request_error")
    model, messages = body.get("model"), body.get("messages")
    if not isinstance(model, str) or not model:
        raise _Refused(400, "'model' is a required string.", "invalid_request_error")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise _Refused(400, "'messages' must be a list of objects.", "invalid_request_error")
    return model, messages


def _estimate_tokens(text: str) -> int:
    # Roughly four characters per token: enough for budgets and benchmarks.
    return max(1, len(text) // 4)


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})
