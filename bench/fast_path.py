"""Fast path: time from SendMessage to the model request at the sandbox, fast vs normal path.

Real processes: the sandbox model and providers servers, the control plane, Redis and one
executor (capacity 4). Two agents answer from the same sandbox scenario (`chat`, no
latency): `fast` is published with AgentSpec.fast_path, `normal` without. Each sample opens
a new session (not timed) and sends one message; its latency is from just before the
SendMessage call to the moment the sandbox model received the turn's request (the request
log's `received_at`; one machine, one wall clock). The sides alternate, one turn at a time,
each waiting for its turn to complete and then a user's short pause (THINK_SECONDS, so the
claim cycle the finished turn's freed slot set off is not still holding the workspace row),
so both see the same machine. The machine's load average is printed with the figures.

  * normal path: SendMessage admits the turn and pokes the replica's dispatcher; its claim
    loop runs the fair claim transaction (lease.sql), reserves credits, reads the steps and
    sends the Assignment; the executor asks the model (not streamed).
  * fast path: SendMessage admits the turn and, in the same request, leases exactly that
    run to the executor stream with a free slot (control_plane/dispatch/fast_path.py) and
    sends the Assignment; the executor asks the model with stream=true.

Then a short streaming phase: fast-path turns of the `fast_chat` scenario (a word every
60 ms), each watched with WatchRun(deltas=true) right after SendMessage: when the first
delta reached the watcher, against when the decision step's commit transaction began
(steps.created_at).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field

import asyncpg
import grpc
import httpx

from agentrun.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    run_pb2,
    run_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
)
from bench import api, report
from bench.postgres import bench_postgres, durability
from bench.procs import Procs, workdir
from bench.redis_server import redis_url
from bench.services import ExecutorLinks, start_control_plane, start_executor, start_sandbox
from bench.stats import Summary

TARGET_P50 = 0.020
THINK_SECONDS = 0.05
WARMUP = 10
POLL_SECONDS = 0.005
TURN_DEADLINE = 30.0
DONE = ("completed", "failed", "cancelled")
DECISION_AT = """
SELECT extract(epoch FROM created_at) AS at FROM steps
WHERE workspace_id = $1 AND run_id = $2 AND kind = 'model_decision' ORDER BY seq LIMIT 1
"""


@dataclass
class Bench:
    chan: grpc.aio.Channel
    conn: asyncpg.Connection
    model_url: str
    # How long each SendMessage took (the fast path's includes its dispatch).
    replied: list[float] = field(default_factory=list)

    @property
    def sessions(self) -> session_pb2_grpc.SessionServiceStub:
        return session_pb2_grpc.SessionServiceStub(self.chan)

    async def publish(self, agent_id: str, model: str, fast: bool) -> None:
        agents = agent_pb2_grpc.AgentServiceStub(self.chan)
        await agents.CreateAgent(
            agent_pb2.CreateAgentRequest(workspace_id=api.WORKSPACE, agent_id=agent_id)
        )
        spec = agent_pb2.AgentSpec(model=model, instructions="benchmark", fast_path=fast)
        await agents.PublishAgentVersion(
            agent_pb2.PublishAgentVersionRequest(
                workspace_id=api.WORKSPACE, agent_id=agent_id, spec=spec
            )
        )

    async def turn(self, agent_id: str) -> tuple[str, float]:
        """Send one message in a new session; (run id, wall time just before SendMessage)."""
        created = await self.sessions.CreateSession(
            session_pb2.CreateSessionRequest(
                workspace_id=api.WORKSPACE, agent_id=agent_id, title="bench"
            )
        )
        request = session_pb2.SendMessageRequest(
            workspace_id=api.WORKSPACE, session_id=created.session.session_id, text="hello"
        )
        sent_at = time.time()
        reply = await self.sessions.SendMessage(request)
        self.replied.append(time.time() - sent_at)
        return reply.turn.run_id, sent_at

    async def wait_done(self, run_id: str) -> None:
        end = time.monotonic() + TURN_DEADLINE
        query = "SELECT status FROM runs WHERE run_id = $1"
        while (status := await self.conn.fetchval(query, run_id)) not in DONE:
            if time.monotonic() > end:
                raise TimeoutError(f"run {run_id} still {status} after {TURN_DEADLINE:.0f}s")
            await asyncio.sleep(POLL_SECONDS)
        if status != "completed":
            raise RuntimeError(f"run {run_id} ended {status}")

    async def arrivals(self) -> dict[str, float]:
        """When the sandbox received each run's first model request."""
        async with httpx.AsyncClient(timeout=30) as http:
            entries = (await http.get(f"{self.model_url}/_sandbox/requests")).json()["requests"]
        first: dict[str, float] = {}
        for entry in entries:
            if entry.get("run_id"):
                first.setdefault(entry["run_id"], entry["received_at"])
        return first


async def latencies(bench: Bench, samples: int) -> dict[str, list[float]]:
    """SendMessage -> model request, per side, alternating fast and normal turns."""
    sent: dict[str, list[tuple[str, float]]] = {"fast": [], "normal": []}
    replied: dict[str, list[float]] = {"fast": [], "normal": []}
    for i in range(WARMUP + samples):
        for side in ("fast", "normal"):
            run_id, at = await bench.turn(side)
            await bench.wait_done(run_id)
            await asyncio.sleep(THINK_SECONDS)
            if i >= WARMUP:
                sent[side].append((run_id, at))
                replied[side].append(bench.replied[-1])
    arrived = await bench.arrivals()
    got = {side: [arrived[r] - at for r, at in pairs] for side, pairs in sent.items()}
    return got | {f"{side} reply": replied[side] for side in replied}


async def first_delta(bench: Bench) -> tuple[float, float]:
    """One streamed fast-path turn: (first delta at the watcher, decision transaction begun),
    both in seconds after SendMessage."""
    run_id, sent_at = await bench.turn("streamer")
    watch = run_pb2_grpc.RunServiceStub(bench.chan).WatchRun(
        run_pb2.WatchRunRequest(workspace_id=api.WORKSPACE, run_id=run_id, deltas=True),
        timeout=TURN_DEADLINE,
    )
    delta_at = float("nan")
    async for event in watch:
        if event.WhichOneof("event") == "delta":
            delta_at = time.time()
            break
    watch.cancel()
    await bench.wait_done(run_id)
    decided = await bench.conn.fetchval(DECISION_AT, api.WORKSPACE, run_id)
    return delta_at - sent_at, float(decided) - sent_at


async def measure(samples: int, streamed: int) -> None:
    async with bench_postgres() as pg:
        dsn = await pg.create_database("fast_path")
        report.note(await durability(dsn))
        with workdir("fast_path") as tmp, redis_url() as redis, Procs(tmp) as procs:
            _, model_port = await start_sandbox(procs, "model")
            _, providers_port = await start_sandbox(procs, "providers")
            cp, cp_port = await start_control_plane(procs, dsn)
            keys = await api.mint_keys(dsn)
            links = ExecutorLinks(
                cp_port, model_port, providers_port, redis, executor_key=keys.executor
            )
            executor = start_executor(procs, "bench-fast-path", links, capacity=4)
            await cp.wait_log(f"executor {executor.name} connected", watch=executor)
            conn = await asyncpg.connect(dsn)
            try:
                async with api.channel(cp_port, keys.admin) as chan:
                    bench = Bench(chan, conn, f"http://127.0.0.1:{model_port}")
                    for agent_id, model, fast in (
                        ("fast", "chat", True),
                        ("normal", "chat", False),
                        ("streamer", "fast_chat", True),
                    ):
                        await bench.publish(agent_id, model, fast)
                    sides = await latencies(bench, samples)
                    deltas = [await first_delta(bench) for _ in range(streamed)]
            finally:
                await conn.close()
    _print(sides, deltas)


def _print(sides: dict[str, list[float]], deltas: list[tuple[float, float]]) -> None:
    fast, normal = Summary.of(sides["fast"]), Summary.of(sides["normal"])
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    report.note(
        f"load average {load} on {os.cpu_count()} cores; {THINK_SECONDS * 1000:.0f} ms "
        "between turns"
    )
    report.table(
        report.LATENCY_HEADERS,
        [
            report.latency_row("fast path (SendMessage leases + assigns)", fast),
            report.latency_row("normal path (poke -> claim loop -> assign)", normal),
            report.latency_row("  SendMessage call, fast path", Summary.of(sides["fast reply"])),
            report.latency_row(
                "  SendMessage call, normal path", Summary.of(sides["normal reply"])
            ),
        ],
    )
    met = fast.p50 <= TARGET_P50
    print(
        f"   fast path p50 {report.ms(fast.p50)} ms   target <= {TARGET_P50 * 1000:.0f} ms   "
        f"{'MET' if met else 'NOT MET'}",
        flush=True,
    )
    first, decided = [d for d, _ in deltas], [c for _, c in deltas]
    before = sum(1 for d, c in deltas if d < c)
    report.table(
        report.LATENCY_HEADERS,
        [
            report.latency_row("first delta at the watcher", Summary.of(first)),
            report.latency_row("decision step's commit began", Summary.of(decided)),
        ],
    )
    report.note(f"first delta before the decision commit in {before} of {len(deltas)} turns")


def run(quick: bool = False) -> None:
    samples, streamed = (30, 3) if quick else (100, 10)  # p50 target: 100 turns a side
    report.heading(f"fastpath: SendMessage -> model request, {samples} turns per side")
    asyncio.run(measure(samples, streamed))
