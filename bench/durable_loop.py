"""The simplest durable loop a user could write: the floor bench/e2e.py sets agentrun beside.

`python -m bench.durable_loop --dsn D --model-base URL --providers-base URL --runs N
--concurrency C --go FILE --out FILE`: one process runs N steps10 runs, C at a time on one
event loop, making the same HTTP calls as the executors and DBOS (the sandbox model server
and its echo provider; the conversation is dbos_baseline's, restated here so that this floor
needs no DBOS) with aiohttp, the executors' client. Each action's result is INSERTed into
`loop_steps` and committed (autocommit, one statement, an asyncpg pool) before the run goes
on: durable in the sense that a crashed run's finished actions are on disk. Nothing else:
no lease, no fence, no fairness, no caps, no retries, no second process watching.

It waits for the file `--go` to exist before the timed runs (so that two processes start
together), then writes {"actions", "seconds"} to `--out`. e2e starts two, as agentrun runs in
two processes (control plane and executor).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
import uuid
from collections.abc import Generator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from executor.tools.catalogue import Catalogue
from telemetry import event_loop

MODEL = "steps10"
INSTRUCTIONS = "benchmark"
TABLE = """
CREATE TABLE IF NOT EXISTS loop_steps (
    run_id      uuid NOT NULL,
    seq         integer NOT NULL,
    payload     jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, seq)
)
"""
INSERT = "INSERT INTO loop_steps (run_id, seq, payload) VALUES ($1, $2, $3)"
Request = tuple[str, Any, Any]


def conversation(run_id: str, text: str) -> Generator[Request, Any, str]:
    """bench/dbos_baseline.py's conversation: model, then its tool calls, until it answers."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": text},
    ]
    seq = itertools.count(1)
    while True:
        message = yield ("model", next(seq), messages)
        calls = message.get("tool_calls") or []
        if not calls:
            return str(message.get("content") or "")
        messages.append(
            {"role": "assistant", "content": message.get("content"), "tool_calls": calls}
        )
        for call in calls:
            result = yield ("echo", f"{run_id}:{call['id']}", call["function"]["arguments"])
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)}
            )


class Loop:
    def __init__(
        self, session: aiohttp.ClientSession, pool: asyncpg.Pool, model: str, providers: str
    ) -> None:
        self._http, self._pool = session, pool
        self._model_url = model.rstrip("/") + "/chat/completions"
        self._echo_url = providers.rstrip("/") + "/echo"
        self._tools = Catalogue.load().openai_tools(["echo"])
        self.actions = 0

    async def _record(self, run_id: uuid.UUID, seq: int, result: Any) -> None:
        await self._pool.execute(INSERT, run_id, seq, json.dumps(result))
        self.actions += 1

    async def run(self, text: str) -> str:
        run_id = uuid.uuid4()
        talk = conversation(str(run_id), text)
        answer: Any = None
        step = itertools.count(1)
        try:
            while True:
                kind, first, second = talk.send(answer)
                if kind == "model":
                    body = {"model": MODEL, "messages": second, "tools": self._tools}
                    headers = {"X-Agentrun-Run-Id": str(run_id), "X-Agentrun-Seq": str(first)}
                    async with self._http.post(self._model_url, json=body, headers=headers) as r:
                        r.raise_for_status()
                        answer = (await r.json())["choices"][0]["message"]
                else:
                    headers = {"Idempotency-Key": first, "Accept": "application/json"}
                    async with self._http.post(
                        self._echo_url, json=json.loads(second), headers=headers
                    ) as r:
                        r.raise_for_status()
                        answer = await r.json()
                await self._record(run_id, next(step), answer)
        except StopIteration as done:
            return str(done.value)


async def _until_exists(path: Path, within: float = 600.0) -> None:
    for _ in range(int(within / 0.01)):
        if await asyncio.to_thread(path.exists):
            return
        await asyncio.sleep(0.01)
    raise TimeoutError(f"{path} did not appear within {within:.0f}s")


async def serve(args: argparse.Namespace) -> None:
    pool = await asyncpg.create_pool(args.dsn, min_size=2, max_size=min(args.concurrency, 20))
    await pool.execute(TABLE)
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0)
    timeout = aiohttp.ClientTimeout(total=60.0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        loop = Loop(session, pool, args.model_base, args.providers_base)
        gate = asyncio.Semaphore(args.concurrency)

        async def one(text: str) -> str:
            async with gate:
                return await loop.run(text)

        await asyncio.gather(*(one(f"warm-up {i}") for i in range(min(8, args.runs))))
        await _until_exists(args.go)
        loop.actions = 0
        start = time.perf_counter()
        answers = await asyncio.gather(*(one(f"benchmark run {i}") for i in range(args.runs)))
        elapsed = time.perf_counter() - start
    await pool.close()
    if not all(answers):
        raise RuntimeError(f"{sum(map(bool, answers))} of {args.runs} runs answered")
    args.out.write_text(json.dumps({"actions": loop.actions, "seconds": elapsed}))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.durable_loop")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--model-base", required=True)
    parser.add_argument("--providers-base", required=True)
    parser.add_argument("--runs", type=int, required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--go", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    event_loop.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
