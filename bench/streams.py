"""Durable Streams: many live readers of one stream on one replica (docs/streams.md).

Real processes: Postgres and one control plane. A JSON stream of the bench workspace has
READERS live SSE readers (`?offset=now&live=sse`, one httpx client, one connection each),
all on the one replica; once each has its first control event, APPENDS appends go in one
every APPEND_EVERY seconds, each carrying the wall-clock time it was sent. For every
(reader, append) pair: the time from just before the POST to the reader parsing the
`data` event (one machine, one clock: the readers run in this process, so their own
parsing is in the figure). The control plane's and Postgres's CPU seconds over the append
phase are divided by the events delivered; what they spend a second over the 3 s before
the appends (the readers connected, nothing appended) is printed too, as is the machine's
load average.

Every append wakes each reader (LISTEN/NOTIFY); the readers one append wakes share one
read per question (http/streams.py SharedReads). The phase runs on fresh control planes:
without sharing (AGENTRUN_STREAM_SHARED_READS=off: each reader asks Postgres itself, four
statements per reader per append, queued on the pool) and with it, all readers on the
bench's admin key; then with it, each reader on its OWN key (created through the real
API, WorkspaceAdminService.CreateApiKey: half of them readers, half operators).

The same readers of a run's stream (`_agentrun/runs/{run}`, a projection of the step
log), whose appends are the model's deltas (written as the executors' are, by the delta
store's statement, for a run the bench holds): one key (a reader key) and each its own
(half readers, half operators), each before (AGENTRUN_STREAM_SHARED_READS=per-reader:
every reader looks again on its own 0.25 s timer and shares a look only with readers of
its own principal, so its visibility is looked up per principal per look) and after (one
look at the stream every 0.25 s for all its readers, which wakes them all only when it
moved; a membership look only for a private session's), interleaved in one run. A run's
stream is woken by that look, not by a NOTIFY: its figures include the wait for the next.

Token streaming: the same agent (the sandbox's `long_answer`, 200 words streamed about
100 a second) run RUNS times by an executor that streams every call (the text in chunks
to the run's Durable Stream) and RUNS times by one that does not (AGENTRUN_MODEL_STREAM=
off), one after the other, with the same control plane and database: the CPU seconds of
the control plane, the executor and Postgres over each phase, divided by the completion
tokens generated (the decisions' usage), less what the same processes spend idle over as
long (measured just before: a streamed phase lasts longer). The sandbox model server's own
cost (its streaming) is not ours and is left out.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from dataclasses import dataclass, field

import asyncpg
import grpc
import httpx

from agentrun.v1 import admin_pb2, admin_pb2_grpc
from bench import api, cpu, report, services
from bench.postgres import bench_postgres
from bench.procs import Proc, Procs, workdir
from bench.redis_server import redis_url
from bench.services import start_control_plane, start_sandbox
from bench.stats import Summary
from control_plane.store import queries

APPEND_EVERY = 0.2
CONNECT_DEADLINE = 120.0
DELIVERY_DEADLINE = 60.0


@dataclass
class Reader:
    latencies: list[float] = field(default_factory=list)
    ready: asyncio.Event = field(default_factory=asyncio.Event)


def sent_at(value: dict[str, object]) -> float:
    """When an appended value was sent: a workspace stream's `t`, a run delta's text."""
    delta = value.get("delta")
    return float(delta["text"] if isinstance(delta, dict) else value["t"])  # type: ignore[arg-type]


async def read(client: httpx.AsyncClient, url: str, key: str, reader: Reader, appends: int) -> None:
    """One SSE reader: ready at its first control event; the latency of each data event."""
    params = {"offset": "now", "live": "sse"}
    headers = {"authorization": f"Bearer {key}"}
    async with client.stream("GET", url, params=params, headers=headers) as res:
        res.raise_for_status()
        event = ""
        async for line in res.aiter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:") and event == "control":
                reader.ready.set()
            elif line.startswith("data:") and event == "data":
                got = time.time()
                for value in json.loads(line[5:]):
                    reader.latencies.append(got - sent_at(value))
                if len(reader.latencies) >= appends:
                    return


@dataclass
class Phase:
    """One live-readers phase: what each reader measured, and what it cost."""

    label: str
    group: list[Reader]
    readers: int
    appends: int
    took: float
    cp_used: float
    pg_used: float
    idle: float  # CPU seconds a second, control plane and Postgres, before the appends


# (label, AGENTRUN_STREAM_SHARED_READS, which stream, whose keys): one fresh control plane
# and database each, in this order (a run stream's before and after interleaved).
PHASES = [
    ("workspace stream, one key, each reader reads", "off", "workspace", "one"),
    ("workspace stream, one key, shared reads", "on", "workspace", "one"),
    ("workspace stream, own keys, shared reads", "on", "workspace", "own"),
    ("run stream, one key, before (per reader)", "per-reader", "run", "one"),
    ("run stream, one key, after (one look)", "on", "run", "one"),
    ("run stream, own keys, before (per reader)", "per-reader", "run", "own"),
    ("run stream, own keys, after (one look)", "on", "run", "own"),
]
DELTA_SEQ, DELTA_EPOCH = 1000, 1  # the bench's run's model call under way, and its lease


async def measure(readers: int, appends: int) -> None:
    async with bench_postgres() as pg:
        phases = []
        for i, (label, shared, target, keys) in enumerate(PHASES):
            dsn = await pg.create_database(f"streams_{i}")
            phases.append(
                await live_readers(pg, dsn, label, shared, target, keys, readers, appends)
            )
    _print(phases)


async def own_keys(chan: grpc.aio.Channel, n: int) -> list[str]:
    """`n` keys of the bench workspace, each its own principal, minted through
    WorkspaceAdminService.CreateApiKey: even ones readers, odd ones operators."""
    admin = admin_pb2_grpc.WorkspaceAdminServiceStub(chan)
    made: list[str] = [""] * n

    async def mint(i: int) -> None:
        reply = await admin.CreateApiKey(
            admin_pb2.CreateApiKeyRequest(
                kind=admin_pb2.API_KEY_KIND_WORKSPACE,
                workspace_id=api.WORKSPACE,
                role="reader" if i % 2 == 0 else "operator",
                principal=f"bench-reader-{i}",
            )
        )
        made[i] = reply.key_text

    for start in range(0, n, 32):
        await asyncio.gather(*(mint(i) for i in range(start, min(n, start + 32))))
    return made


async def held_run(dsn: str, chan: grpc.aio.Channel) -> uuid.UUID:
    """A run the bench holds as an executor would (running, its lease at DELTA_EPOCH), so
    that the delta store's statement keeps its deltas."""
    await api.publish_agent(chan, "talker", "long_answer", [])
    run_id = uuid.UUID((await api.start_run(chan, "talker", "talk")).run_id)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "UPDATE runs SET status = 'running', lease_owner = 'bench-holder', lease_epoch = $2,"
            " wake_at = now() + interval '1 hour', held_since = now(), started_at = now()"
            " WHERE run_id = $1",
            run_id,
            DELTA_EPOCH,
        )
    finally:
        await conn.close()
    return run_id


async def live_readers(
    pg: object,
    dsn: str,
    label: str,
    shared: str,
    target: str,
    whose: str,
    readers: int,
    appends: int,
) -> Phase:
    with workdir("streams") as tmp, Procs(tmp) as procs:
        port_file = tmp / "http.port"
        cp, cp_port = await start_control_plane(
            procs,
            dsn,
            AGENTRUN_HTTP_PORT_FILE=str(port_file),
            AGENTRUN_STREAM_SHARED_READS=shared,
        )
        keys = await api.mint_keys(dsn)
        base = f"http://127.0.0.1:{port_file.read_text().strip()}"
        ws_url = f"{base}/v1/workspaces/{api.WORKSPACE}/streams"
        async with api.channel(cp_port, keys.admin) as chan:
            run_id = await held_run(dsn, chan) if target == "run" else None
            if whose == "own":
                reader_keys = await own_keys(chan, readers)
            elif target == "run":  # one principal below admin: its visibility is looked up
                reader_keys = (await own_keys(chan, 1)) * readers
            else:
                reader_keys = [keys.admin] * readers
        url = f"{ws_url}/_agentrun/runs/{run_id}" if run_id else f"{ws_url}/bench/live"
        limits = httpx.Limits(max_connections=readers + 10, max_keepalive_connections=0)
        headers = {"authorization": f"Bearer {keys.admin}"}
        writer = await asyncpg.connect(dsn)
        async with httpx.AsyncClient(headers=headers, timeout=None, limits=limits) as client:
            if run_id is None:
                made = await client.put(url, headers={"content-type": "application/json"})
                made.raise_for_status()
            group = [Reader() for _ in range(readers)]
            tasks = [
                asyncio.create_task(read(client, url, k, r, appends))
                for k, r in zip(reader_keys, group, strict=True)
            ]
            await asyncio.wait_for(
                asyncio.gather(*(r.ready.wait() for r in group)), CONNECT_DEADLINE
            )
            # What the readers cost while nothing is appended (their looks at the stream).
            idle_from = cpu.process_cpu(cp.pid) + _pg_cpu(pg)
            await asyncio.sleep(IDLE_SECONDS)
            idle = (cpu.process_cpu(cp.pid) + _pg_cpu(pg) - idle_from) / IDLE_SECONDS
            cp_before, pg_before = cpu.process_cpu(cp.pid), _pg_cpu(pg)
            began = time.monotonic()
            for i in range(appends):
                if run_id is not None:  # a model delta, as the delta store writes one
                    await queries.run(
                        writer,
                        "stream_deltas_put",
                        api.WORKSPACE,
                        [run_id],
                        [DELTA_SEQ],
                        [DELTA_EPOCH],
                        [i],
                        [repr(time.time())],
                    )
                else:
                    body = json.dumps([{"i": i, "t": time.time()}])
                    sent = await client.post(
                        url, content=body, headers={"content-type": "application/json"}
                    )
                    sent.raise_for_status()
                await asyncio.sleep(APPEND_EVERY)
            done, late = await asyncio.wait(tasks, timeout=DELIVERY_DEADLINE)
            took = time.monotonic() - began
            cp_used, pg_used = cpu.process_cpu(cp.pid) - cp_before, _pg_cpu(pg) - pg_before
            for task in late:
                task.cancel()
        await writer.close()
    return Phase(label, group, readers, appends, took, cp_used, pg_used, idle)


def _pg_cpu(pg: object) -> float:
    pid = getattr(pg, "server_pid", None)
    return cpu.tree_cpu(pid) if pid else 0.0


def _print(phases: list[Phase]) -> None:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    report.note(f"load average {load} on {os.cpu_count()} cores")
    rows = []
    for p in phases:
        latencies = [x for r in p.group for x in r.latencies]
        rows.append(
            report.latency_row(f"append -> SSE data event, {p.label}", Summary.of(latencies))
        )
    report.table(report.LATENCY_HEADERS, rows)
    for p in phases:
        delivered = sum(len(r.latencies) for r in p.group)
        per_event = 1000 * (p.cp_used + p.pg_used) / max(delivered, 1)
        report.note(
            f"{p.label}: {delivered} of {p.readers * p.appends} events delivered in a "
            f"{p.took:.1f} s append phase; CPU per delivered event {per_event:.2f} ms "
            f"(control plane {p.cp_used:.1f} s, Postgres {p.pg_used:.1f} s); idle readers "
            f"{1000 * p.idle:.0f} ms of CPU a second"
        )


TOKEN_DONE = ("completed", "failed", "cancelled")
IDLE_SECONDS = 3.0


@dataclass
class TokenPhase:
    label: str
    runs: int
    completed: int
    tokens: int
    took: float
    cp_used: float
    executor_used: float
    pg_used: float

    @property
    def cpu_used(self) -> float:
        return self.cp_used + self.executor_used + self.pg_used


async def token_cost(runs: int) -> None:
    """RUNS runs of `long_answer` streamed, then RUNS not streamed (module docstring)."""
    async with bench_postgres() as pg:
        dsn = await pg.create_database("streams_tokens")
        with workdir("streams_tokens") as tmp, redis_url() as redis, Procs(tmp) as procs:
            _, model_port = await start_sandbox(procs, "model")
            _, providers_port = await start_sandbox(procs, "providers")
            cp, cp_port = await start_control_plane(procs, dsn)
            keys = await api.mint_keys(dsn)
            conn = await asyncpg.connect(dsn)
            phases = []
            try:
                async with api.channel(cp_port, keys.admin) as chan:
                    await api.publish_agent(chan, "talker", "long_answer", [])
                    for label, stream in (("streamed", "on"), ("not streamed", "off")):
                        env = services._env(
                            AGENTRUN_LOG_LEVEL="WARNING",
                            REDIS_URL=redis,
                            AGENTRUN_CONTROL_PLANE=f"127.0.0.1:{cp_port}",
                            AGENTRUN_MODEL_BASE_URL=f"http://127.0.0.1:{model_port}/v1",
                            AGENTRUN_PROVIDERS_URL=f"http://127.0.0.1:{providers_port}",
                            AGENTRUN_CAPACITY=str(runs),
                            AGENTRUN_EXECUTOR_ID=f"bench-tokens-{stream}",
                            AGENTRUN_EXECUTOR_KEY=keys.executor,
                            AGENTRUN_MODEL_STREAM=stream,
                        )
                        executor = procs.start(
                            f"bench-tokens-{stream}",
                            services._python("executor"),
                            env,
                            cwd=services.REPO,
                        )
                        await cp.wait_log(f"executor {executor.name} connected", watch=executor)
                        await asyncio.sleep(1.0)  # its start-up (and canary) are not counted
                        phases.append(
                            await _token_phase(conn, chan, label, runs, [cp, executor], pg)
                        )
                        procs.stop(executor)
            finally:
                await conn.close()
    _print_tokens(phases)


async def _token_phase(
    conn: asyncpg.Connection,
    chan: grpc.aio.Channel,
    label: str,
    runs: int,
    procs: list[Proc],
    pg: object,
) -> TokenPhase:
    def used_so_far() -> list[float]:
        return [cpu.process_cpu(p.pid) for p in procs] + [_pg_cpu(pg)]

    # What the processes spend idle (heartbeats, sweeps, pollers) is not the runs': a
    # phase of streamed runs lasts longer, so it is measured and taken off.
    idle_from = used_so_far()
    await asyncio.sleep(IDLE_SECONDS)
    before = used_so_far()
    idle_rate = [(b - a) / IDLE_SECONDS for a, b in zip(idle_from, before, strict=True)]
    began = time.monotonic()
    ids = [
        uuid.UUID((await api.start_run(chan, "talker", f"talk {i}")).run_id) for i in range(runs)
    ]
    deadline = began + DELIVERY_DEADLINE
    while time.monotonic() < deadline:
        done = await conn.fetchval(
            "SELECT count(*) FROM runs WHERE run_id = ANY($1) AND status = ANY($2)",
            ids,
            list(TOKEN_DONE),
        )
        if done == runs:
            break
        await asyncio.sleep(0.05)
    took = time.monotonic() - began
    after = used_so_far()
    used = [
        max(0.0, a - b - rate * took) for a, b, rate in zip(after, before, idle_rate, strict=True)
    ]
    row = await conn.fetchrow(
        "SELECT count(*) FILTER (WHERE r.status = 'completed') AS completed,"
        " coalesce(sum((s.payload->'usage'->>'completion_tokens')::bigint), 0)::bigint AS tokens"
        " FROM runs r LEFT JOIN steps s ON s.workspace_id = r.workspace_id"
        " AND s.run_id = r.run_id AND s.kind = 'model_decision' WHERE r.run_id = ANY($1)",
        ids,
    )
    return TokenPhase(label, runs, row["completed"], row["tokens"], took, *used)


def _print_tokens(phases: list[TokenPhase]) -> None:
    for p in phases:
        per_token = 1000 * p.cpu_used / max(p.tokens, 1)
        report.note(
            f"{p.label}: {p.completed} of {p.runs} runs completed in {p.took:.1f} s, "
            f"{p.tokens} tokens generated; CPU {p.cpu_used:.2f} s (control plane "
            f"{p.cp_used:.2f}, executor {p.executor_used:.2f}, Postgres {p.pg_used:.2f}): "
            f"{per_token:.3f} ms per generated token"
        )
    on, off = phases
    extra = (on.cpu_used - off.cpu_used) / max(on.tokens, 1)
    report.note(
        f"token streaming costs {1000 * extra:.3f} ms of CPU per generated token "
        f"({1_000_000 * extra:.0f} us) beside the same runs not streamed"
    )


FEED_ROUNDS = 5


async def feed_trigger_cost(runs: int) -> None:
    """What the workspace feed's trigger (runs_feed_state, migration 0043: one event row
    per run state change, the claim's included) adds to a state change: RUNS queued runs
    (StartRun, no executor) are moved queued -> waiting -> queued, one autocommit UPDATE
    per run, and then as one UPDATE of all of them (as a claim batch moves its runs), with
    the trigger enabled and disabled in alternating rounds on one connection."""
    async with bench_postgres() as pg:
        dsn = await pg.create_database("streams_feed")
        with workdir("streams_feed") as tmp, Procs(tmp) as procs:
            cp, cp_port = await start_control_plane(procs, dsn)
            keys = await api.mint_keys(dsn)
            async with api.channel(cp_port, keys.admin) as chan:
                await api.publish_agent(chan, "idle", "chat", [])
                await api.start_runs(chan, "idle", runs, 16)
            procs.stop(cp)  # nothing else moves the runs
        conn = await asyncpg.connect(dsn)
        try:
            ids = [r["run_id"] for r in await conn.fetch(FEED_QUEUED)]
            one: dict[bool, list[float]] = {True: [], False: []}
            batch: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(FEED_ROUNDS):
                for enabled in (True, False):
                    switch = "ENABLE" if enabled else "DISABLE"
                    await conn.execute(f"ALTER TABLE runs {switch} TRIGGER runs_feed_state")
                    for run_id in ids:
                        for status, reason in (("waiting", "bench"), ("queued", None)):
                            began = time.perf_counter()
                            await conn.execute(FEED_MOVE_ONE, status, reason, run_id)
                            one[enabled].append(time.perf_counter() - began)
                    for status, reason in (("waiting", "bench"), ("queued", None)):
                        began = time.perf_counter()
                        await conn.execute(FEED_MOVE_ALL, status, reason, ids)
                        batch[enabled].append((time.perf_counter() - began) / len(ids))
            await conn.execute("ALTER TABLE runs ENABLE TRIGGER runs_feed_state")
        finally:
            await conn.close()
    on, off = Summary.of(one[True]), Summary.of(one[False])
    report.table(
        report.LATENCY_HEADERS,
        [
            report.latency_row("one run's state change, feed trigger on", on),
            report.latency_row("one run's state change, feed trigger off", off),
        ],
    )
    per_row_on = sorted(batch[True])[len(batch[True]) // 2]
    per_row_off = sorted(batch[False])[len(batch[False]) // 2]
    report.note(
        f"one UPDATE of {len(ids)} runs (a claim batch's shape), per run, median: "
        f"{1000 * per_row_on:.3f} ms with the trigger, {1000 * per_row_off:.3f} ms without "
        f"(+{1000 * (per_row_on - per_row_off):.3f} ms per state change)"
    )


FEED_QUEUED = "SELECT run_id FROM runs WHERE status = 'queued'"
FEED_MOVE_ONE = "UPDATE runs SET status = $1, wait_reason = $2 WHERE run_id = $3"
FEED_MOVE_ALL = "UPDATE runs SET status = $1, wait_reason = $2 WHERE run_id = ANY($3)"


def run(quick: bool = False) -> None:
    readers, appends = (100, 10) if quick else (1000, 25)
    report.heading(f"streams: {readers} live SSE readers of one stream, {appends} appends")
    asyncio.run(measure(readers, appends))
    runs = 10 if quick else 40
    report.heading(f"streams: token streaming, {runs} runs of 200 words streamed and not")
    asyncio.run(token_cost(runs))
    moved = 200 if quick else 1000
    report.heading(f"streams: the workspace feed's trigger, {moved} runs changing state")
    asyncio.run(feed_trigger_cost(moved))
