"""The tool client against a provider that answers with anything (a real socket).

A tool provider's answer is untrusted input, as a model's is (test_fuzz_models.py). The
client promises (executor/tools/http_tool.py `send`) the provider's JSON or text, or a
ToolSendError the delivery sorts into an outcome; any other exception ends the run's task
with the call started and no result, and the next executor resolves it and fails the
same way. Whatever comes back is recorded as a `tool_result` step: the control plane must
accept it, or the commit is refused and the run fails.

Each request here gets any status, Retry-After of any shape, a body of JSON holding NaN,
Infinity, NUL and lone surrogate escapes or arrays nested 600 deep, undecodable bytes, JSON
nested 50,000 deep, an error document of any shape, under any content type and charset,
or a connection dropped or cut short, from a generator seeded by the request's
idempotency key (so a failure names the seed that reproduces it).
"""

from __future__ import annotations

import json
import random
from typing import Any

from executor.config import ExecutorConfig
from executor.tools.catalogue import Catalogue
from executor.tools.http_tool import HttpToolClient
from tests.harness import hostile
from tests.harness.http_stub import CUT, DROP, Reply, Seen, serving
from tests.harness.tool_outcomes import ToolOutcomes

CALLS = 300
CATALOGUE = Catalogue.load()
TOOLS = {  # a read and writes of each way the catalogue sends arguments
    "crm_lookup": {"email": "ada@example.com"},
    "chat_post": {"channel": "#sales", "text": "hi"},
    "send_email": {"to": "ada@example.com", "subject": "Hi", "body": "Hello"},
    "crm_upsert": {"email": "ada@example.com", "name": "Ada"},
}
STATUSES = (200,) * 8 + (201, 204, 301, 400, 401, 404, 409, 422, 429, 500, 502, 503)
RETRY_AFTER = ("1", "-1", "x", "1e999", "nan", "999999999999", "Wed, 21 Oct 2015 07:28:00 GMT")
CONTENT_TYPES = (
    "application/json",
    "application/problem+json",
    "text/plain",
    "",
    "text/html; charset=latin-1",
    "application/json; charset=utf-16",
    "text/plain; charset=no-such-charset",
)


KEYS = ("error", "message", "detail", "data", "id", "code", "\x00")


def _value(rng: random.Random) -> Any:
    return hostile.value(rng, KEYS)


def _answer(seen: Seen) -> Reply | str:
    rng = random.Random(seen.headers.get("idempotency-key", ""))
    if rng.random() < 0.03:
        return rng.choice([DROP, CUT])
    status = rng.choice(STATUSES)
    headers = {"Retry-After": rng.choice(RETRY_AFTER)} if rng.random() < 0.3 else {}
    if kind := rng.choice(CONTENT_TYPES):
        headers["Content-Type"] = kind
    roll = rng.random()
    if roll < 0.6:
        body = json.dumps(_value(rng)).encode()  # NaN and Infinity as Python writes them
    elif roll < 0.75:
        body = rng.randbytes(rng.randrange(80))
    elif roll < 0.9:
        body = json.dumps({"error": _value(rng)}).encode()
    else:
        body = b"[" * 50_000 + b"]" * 50_000
    return Reply(status, b"" if status == 204 else body, headers)


async def test_any_answer_is_a_result_or_a_send_error_and_its_step_is_storable() -> None:
    outcomes = ToolOutcomes()
    async with serving(_answer) as provider:
        config = ExecutorConfig(
            providers_url=provider.url,
            provider_urls={"crm": f"{provider.url}/crm-base/"},
            tool_timeout_seconds=2.0,
        )
        client = HttpToolClient(config)
        try:
            for n in range(CALLS):
                name = list(TOOLS)[n % len(TOOLS)]
                key = f"fuzz:{n}"
                await outcomes.judge(key, name, client.send(CATALOGUE.get(name), TOOLS[name], key))
        finally:
            await client.aclose()
    assert not outcomes.wrong, "\n".join(outcomes.wrong[:20])
    counts = outcomes.counts
    assert counts["result"] >= CALLS // 4, counts
    assert counts["ProviderError"] >= CALLS // 10, counts
