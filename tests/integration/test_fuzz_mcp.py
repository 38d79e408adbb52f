"""The MCP client against a server that answers with anything (a real socket).

A remote MCP server is a workspace's data, and what it answers is untrusted input, as a
model's or an HTTP tool's is (test_fuzz_models.py, test_fuzz_tools.py). The client promises
(executor/tools/mcp_call.py `call_mcp`) the tool's result, or a ToolSendError the delivery
sorts into an outcome; any other exception ends the run's task with the call started and no
result, and the next executor resolves it and fails the same way. Whatever comes back is
recorded as a `tool_result` step: the control plane must accept it.

Each session here goes through the handshake (`server/discover` refused, so `initialize`),
`tools/list` and `tools/call`. Any of them may get any HTTP status with a Retry-After of any
shape, a JSON-RPC error of any shape, a result of any shape (content blocks, structured
content, isError, NaN, NUL and lone surrogate escapes, JSON nested 50,000 deep), an event
stream holding any of those or junk, undecodable bytes, or a dropped or cut connection;
`tools/call` more often than the others, so most sessions reach it. The mutations come
from a generator seeded by the session's `x-seed` header, so a failure names the seed
that reproduces it.
"""

from __future__ import annotations

import json
import random
from typing import Any

from executor.tools.mcp_call import call_mcp
from tests.harness import hostile
from tests.harness.http_stub import CUT, DROP, Reply, Seen, serving
from tests.harness.tool_outcomes import ToolOutcomes

CALLS = 240
TOOL = "lookup"
STATUSES = (200,) * 6 + (202, 400, 401, 404, 429, 500, 503)
RETRY_AFTER = (
    "1",
    "-1",
    "x",
    "1e999",
    "nan",
    "inf",
    "999999999999",
    "Wed, 21 Oct 2015 07:28:00 GMT",
)


SOUND = {
    "initialize": {
        "protocolVersion": "2025-06-18",
        "capabilities": {"tools": {}},
        "serverInfo": {"name": "fuzz", "version": "1"},
    },
    "tools/list": {"tools": [{"name": TOOL, "inputSchema": {"type": "object"}}]},
    "tools/call": {"content": [{"type": "text", "text": '{"ok": true}'}]},
}


KEYS = ("type", "text", "data", "isError", "content", "code", "message", "\x00")


def _value(rng: random.Random) -> Any:
    return hostile.value(rng, KEYS)


def _block(rng: random.Random) -> Any:
    """A content block: a text one of any text, or any other shape."""
    roll = rng.random()
    if roll < 0.5:
        return {
            "type": "text",
            "text": rng.choice(
                [
                    '{"ok": true}',
                    "plain",
                    "a\x00b",
                    "half \ud83d",
                    '{"n": NaN}',
                    "[" * 50_000 + "]" * 50_000,
                    '{"x": "\\ud83d"}',
                    "x" * 5000,
                ]
            ),
        }
    if roll < 0.6:
        return {"type": "image", "data": "aGk=", "mimeType": "image/png"}
    return _value(rng)


def _result(rng: random.Random, method: str) -> Any:
    """A result for `method`: mostly a sound one, sometimes any shape."""
    if rng.random() < 0.15:
        return _value(rng)
    if method == "initialize":
        return {
            "protocolVersion": rng.choice(["2025-06-18", "2025-11-25", "1999-01-01", 7]),
            "capabilities": rng.choice([{"tools": {}}, {}, {"tools": 5}]),
            "serverInfo": {"name": "fuzz", "version": "1"},
        }
    if method == "tools/list":
        schema = rng.choice([{"type": "object"}, {"type": "object", "properties": 5}, {}])
        tools = [{"name": TOOL, "inputSchema": schema}]
        if rng.random() < 0.2:
            tools.append({"name": "\x00", "inputSchema": {"type": "object"}})
        listed: dict[str, Any] = {"tools": tools}
        if rng.random() < 0.1:
            listed["nextCursor"] = rng.choice(["next", 5, None])
        return listed
    content = [_block(rng) for _ in range(rng.choice([0, 1, 1, 1, 2]))]
    result: dict[str, Any] = {"content": content}
    if rng.random() < 0.25:
        result["structuredContent"] = rng.choice(
            [_value(rng), {"n": float("nan")}, {"deep": "[" * 700 + "]" * 700}]
        )
    if rng.random() < 0.2:
        result["isError"] = rng.choice([True, False, "yes", 1])
    return result


def _message(rng: random.Random, method: str, rpc_id: Any) -> Any:
    if rng.random() < 0.15:
        error: Any = {
            "code": rng.choice([-32603, -32601, -32000, "x", 1e999, None]),
            "message": _value(rng),
        }
        if rng.random() < 0.3:
            error["data"] = _value(rng)
        return {"jsonrpc": "2.0", "id": rpc_id, "error": rng.choice([error, _value(rng)])}
    message = {"jsonrpc": "2.0", "id": rpc_id, "result": _result(rng, method)}
    if rng.random() < 0.05:
        message["id"] = rng.choice([rpc_id + 1 if isinstance(rpc_id, int) else 0, None, "x"])
    return message


def _answer(seen: Seen) -> Reply | str:
    if seen.method == "GET":  # the server's own stream of requests: none offered
        return Reply(405)
    if seen.method == "DELETE":
        return Reply(200)
    try:
        request = json.loads(seen.body)
    except ValueError:
        return Reply(400)
    method, rpc_id = request.get("method", ""), request.get("id")
    if rpc_id is None:  # a notification
        return Reply(202)
    if method == "server/discover":  # a server of the initialize era
        body = {
            "jsonrpc": "2.0",
            "id": rpc_id,
            "error": {"code": -32601, "message": "Method not found"},
        }
        return Reply(200, json.dumps(body).encode(), {"Content-Type": "application/json"})
    rng = random.Random(f"{seen.headers.get('x-seed', '')}:{method}")
    if rng.random() > (0.8 if method == "tools/call" else 0.2):  # a sound answer
        body = {"jsonrpc": "2.0", "id": rpc_id, "result": SOUND.get(method, {})}
        return Reply(200, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return _mutated(rng, method, rpc_id)


def _mutated(rng: random.Random, method: str, rpc_id: Any) -> Reply | str:
    """Any answer to `method`: a dropped or cut connection, or any status and body."""
    if rng.random() < 0.05:
        return rng.choice([DROP, CUT])
    status = rng.choice(STATUSES)
    headers = {"Retry-After": rng.choice(RETRY_AFTER)} if rng.random() < 0.3 else {}
    roll = rng.random()
    text = json.dumps(_message(rng, method, rpc_id))  # NaN and Infinity as Python writes them
    if roll < 0.55:
        headers["Content-Type"] = rng.choice(["application/json", "application/json; x=1"])
        body = text.encode()
    elif roll < 0.75:
        headers["Content-Type"] = "text/event-stream"
        events = [
            f"event: message\ndata: {text}\n\n",
            f"data: {rng.choice(['junk', '{', text[:40]])}\n\n" + f"data: {text}\n\n",
            f"event: other\ndata: {text}\n\n",
            "data: \x00\n\n",
        ]
        body = rng.choice(events).encode("utf-8", "surrogatepass")
    elif roll < 0.85:
        headers["Content-Type"] = rng.choice(["application/json", "text/event-stream", ""])
        body = rng.randbytes(rng.randrange(80))
    else:
        headers["Content-Type"] = "application/json"
        body = b'{"jsonrpc": "2.0", "id": ' + str(rpc_id).encode() + b', "result": '
        body += b"[" * 50_000 + b"]" * 50_000 + b"}"
    return Reply(status, b"" if status == 202 else body, headers)


async def test_any_answer_is_a_result_or_a_send_error_and_its_step_is_storable() -> None:
    outcomes = ToolOutcomes()
    async with serving(_answer) as server:
        for n in range(CALLS):
            seed = f"fuzz:{n}"
            call = call_mcp(
                f"{server.url}/mcp", TOOL, {"q": "ada"}, headers={"x-seed": seed}, timeout=2.0
            )
            failure = await outcomes.judge(seed, TOOL, call)
            wait = getattr(failure, "retry_after", None)
            if wait is not None and not 0 <= wait < float("inf"):  # NaN fails both
                outcomes.wrong.append(f"seed {seed!r}: a wait of {wait!r}")
    assert not outcomes.wrong, "\n".join(outcomes.wrong[:20])
    counts = outcomes.counts
    # Every way out is taken (seen: about 40 results, 110 ProviderError, 70 NotSent, 15
    # MaybeSent): the mutations reach each stage of the session.
    assert counts["result"] >= CALLS // 10, counts
    assert counts["ProviderError"] >= CALLS // 5, counts
    assert counts["NotSent"] >= CALLS // 10, counts
    assert counts["MaybeSent"] >= 3, counts
