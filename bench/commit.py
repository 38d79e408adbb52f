"""Per-step commit round trip over the executor stream, against a raw single-row INSERT.

The control plane runs as its own process (client and server do not share an event loop).
This process plays a minimal executor: Hello, Ready{1}, take the assignment, then commit one
model_decision step at a time and time each from send to CommitResult. The raw baseline is
an autocommit single-row INSERT of the same payload into a jsonb table of the same database,
over one reused connection. Informational series show where the time goes: the store's
commit (the same fenced statement, through the same kind of pool) called in this process on
a second run; a gRPC health check on the control plane (its interceptors, no database); and
the transport floor, a bare grpc.aio server in its own process (bench/grpc_floor.py) echoing
a Commit-sized message, unary and on a bidi stream like Connect; and the store's commit again,
timed alone but each after a stream echo, as the control plane makes it (its Postgres
backend has sat idle meanwhile, and waking it costs what a back-to-back statement does not
pay). The series run in alternating blocks so that noise from other tenants of the machine
falls on all alike.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import time
import uuid
from collections.abc import Awaitable, Callable

import asyncpg
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentrun.v1 import executor_pb2 as pb
from agentrun.v1 import executor_pb2_grpc, run_pb2
from bench import api, grpc_floor, report
from bench.cpu import process_cpu
from bench.postgres import bench_postgres, durability
from bench.procs import Procs, workdir
from bench.services import start_control_plane, start_grpc_floor
from bench.stats import Summary, ratio
from control_plane.store import lease as lease_store
from control_plane.store import steps as step_store
from control_plane.store.db import create_pool
from control_plane.store.runs import Run

WARMUP = 50
BLOCK = 100
TARGET = 2.0
TARGET_MINIMAL = 1.3  # commit p50, agentrun / the minimal commit server
TARGET_MINIMAL_CPU = 1.5  # server CPU per commit, agentrun's control plane / the minimal one
OURS = "agentrun Commit (1 step, gRPC stream)"
RAW = "raw asyncpg INSERT (1 row, autocommit)"
MINIMAL = "minimal commit server (stream msg, decode, INSERT, answer)"
DIRECT = "  info: store.commit() in-process"
DIRECT_AFTER_HOP = "  info: store.commit() in-process, after a stream echo"
RAW_AFTER_HOP = "  info: raw INSERT, after a stream echo"
PING = "  info: gRPC Health.Check on the control plane"
FLOOR_UNARY = "  info: bare gRPC unary echo (floor)"
FLOOR_STREAM = "  info: bare gRPC stream message echo (floor)"

RAW_TABLE = """
CREATE TABLE bench_raw_insert (
    id          bigserial PRIMARY KEY,
    run_id      uuid NOT NULL,
    seq         integer NOT NULL,
    payload     jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
)
"""
RAW_INSERT = "INSERT INTO bench_raw_insert (run_id, seq, payload) VALUES ($1, $2, $3)"


def decision_payload(seq: int) -> str:
    """A small model_decision payload, as an executor would commit it."""
    return json.dumps(
        {
            "content": f"thinking about step {seq}",
            "tool_calls": [],
            "usage": {"prompt_tokens": 12, "completion_tokens": 5},
            "model": "bench",
            "response_id": f"resp-{seq}",
        }
    )


class StreamExecutor:
    """Just enough of an executor to hold one run and commit steps to it."""

    def __init__(
        self, chan: grpc.aio.Channel, executor_id: str = "bench-commit", key: str | None = None
    ) -> None:
        # The credential goes in the call's metadata, as the executor sends it (a client
        # interceptor would add its own per-message cost to a stream).
        metadata = (("authorization", f"Bearer {key}"),) if key else None
        self._call = executor_pb2_grpc.ExecutorServiceStub(chan).Connect(metadata=metadata)
        self._executor_id = executor_id
        self._request_ids = itertools.count(1)
        self.lease = pb.Lease()
        self.next_seq = 0

    async def _receive(self, kind: str) -> pb.ConnectResponse:
        while True:
            msg = await self._call.read()
            if msg is grpc.aio.EOF:
                raise RuntimeError("the control plane closed the stream")
            if msg.WhichOneof("msg") == kind:
                return msg

    async def take_run(self) -> None:
        # As the executor's own Hello (executor/worker.py): it reads renewals off commit
        # results, so a commit renews the lease only once half of it is left (lease.sql).
        # It declares no release: a release is canaried when its first executor connects
        # (control_plane/deploys/self_check.py) and takes no run until that passes, which
        # this stand-in cannot play; an executor of no release is never checked.
        hello = pb.Hello(executor_id=self._executor_id, capacity=1, reads_commit_renewal=True)
        await self._call.write(pb.ConnectRequest(hello=hello))
        await self._call.write(pb.ConnectRequest(ready=pb.Ready(slots=1)))
        assignment = (await self._receive("assignment")).assignment
        run = assignment.run
        self.lease = pb.Lease(
            workspace_id=run.workspace_id, run_id=run.run_id, epoch=run.lease_epoch
        )
        self.next_seq = max(s.seq for s in assignment.steps) + 1

    async def commit_one(self) -> float:
        """Commit the next step; the seconds from send to an OK CommitResult."""
        step = pb.NewStep(
            seq=self.next_seq,
            kind=run_pb2.STEP_KIND_MODEL_DECISION,
            payload_json=decision_payload(self.next_seq),
        )
        msg = pb.Commit(request_id=next(self._request_ids), lease=self.lease, steps=[step])
        start = time.perf_counter()
        await self._call.write(pb.ConnectRequest(commit=msg))
        result = (await self._receive("commit_result")).commit_result
        elapsed = time.perf_counter() - start
        if result.outcome != pb.COMMIT_OUTCOME_OK:
            raise RuntimeError(f"commit of seq {self.next_seq} refused: {result}")
        self.next_seq += 1
        return elapsed

    def close(self) -> None:
        self._call.cancel()


class RawInserter:
    """The baseline: one row, one statement, autocommit, on one reused connection."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn
        self._run_id = uuid.uuid4()
        self._seq = 0

    async def insert_one(self) -> float:
        self._seq += 1
        payload = decision_payload(self._seq)
        start = time.perf_counter()
        await self._conn.execute(RAW_INSERT, self._run_id, self._seq, payload)
        return time.perf_counter() - start


class StoreCommitter:
    """The store's fenced commit called directly: the SQL without the stream around it."""

    def __init__(self, pool: asyncpg.pool.Pool) -> None:
        self._pool = pool
        self._held: Run | None = None
        self._seq = 1

    async def claim(self) -> None:
        rows = await lease_store.claim_due(self._pool, ["bench-commit-direct"], 3600)
        if not rows:
            raise RuntimeError("no queued run for the direct store series")
        self._held = rows[0]

    async def commit_one(self) -> float:
        assert self._held is not None
        step = step_store.NewStep(self._seq, "model_decision", None, decision_payload(self._seq))
        held = self._held
        # Renewing as the stream's commits do (an executor that reads renewals).
        req = step_store.CommitRequest(
            held.workspace_id, held.run_id, held.lease_epoch, [step], renew_always=False
        )
        start = time.perf_counter()
        await step_store.commit(self._pool, req, 3600)
        self._seq += 1
        return time.perf_counter() - start


def after_hop(
    measure: Callable[[], Awaitable[float]], hop: Callable[[], Awaitable[float]]
) -> Callable[[], Awaitable[float]]:
    """`measure`, timed alone, each time after `hop` (a stream echo, untimed): what a
    statement costs where the control plane makes it, the database idle between two."""

    async def measured() -> float:
        await hop()
        return await measure()

    return measured


def health_probe(chan: grpc.aio.Channel) -> Callable[[], Awaitable[float]]:
    """A unary gRPC round trip that touches no database: what the transport alone costs."""
    stub = health_pb2_grpc.HealthStub(chan)

    async def check() -> float:
        start = time.perf_counter()
        await stub.Check(health_pb2.HealthCheckRequest())
        return time.perf_counter() - start

    return check


def floor_probes(chan: grpc.aio.Channel) -> dict[str, Callable[[], Awaitable[float]]]:
    """Round trips to the bare server: a unary call, and one message on an open stream."""
    body = pb.ConnectRequest(
        commit=pb.Commit(
            request_id=1,
            lease=pb.Lease(workspace_id="bench", run_id=str(uuid.uuid4()), epoch=1),
            steps=[
                pb.NewStep(
                    seq=1, kind=run_pb2.STEP_KIND_MODEL_DECISION, payload_json=decision_payload(1)
                )
            ],
        )
    ).SerializeToString()
    unary = chan.unary_unary(grpc_floor.UNARY)
    stream = chan.stream_stream(grpc_floor.STREAM)()

    async def call() -> float:
        start = time.perf_counter()
        await unary(body)
        return time.perf_counter() - start

    async def message() -> float:
        start = time.perf_counter()
        await stream.write(body)
        await stream.read()
        return time.perf_counter() - start

    return {FLOOR_UNARY: call, FLOOR_STREAM: message}


def minimal_committer(chan: grpc.aio.Channel) -> Callable[[], Awaitable[float]]:
    """Commits to the minimal commit server (bench/grpc_floor.py, /bench.Floor/Commit): a
    Commit like the stream executor's, sent on one open stream; its CommitResult decoded."""
    stream = chan.stream_stream(grpc_floor.COMMIT)()
    run_id, seqs = str(uuid.uuid4()), itertools.count(1)
    lease = pb.Lease(workspace_id="bench", run_id=run_id, epoch=1)

    async def commit() -> float:
        seq = next(seqs)
        step = pb.NewStep(
            seq=seq, kind=run_pb2.STEP_KIND_MODEL_DECISION, payload_json=decision_payload(seq)
        )
        body = pb.ConnectRequest(commit=pb.Commit(request_id=seq, lease=lease, steps=[step]))
        start = time.perf_counter()
        await stream.write(body.SerializeToString())
        answer = pb.ConnectResponse.FromString(await stream.read())
        elapsed = time.perf_counter() - start
        if answer.commit_result.outcome != pb.COMMIT_OUTCOME_OK:
            raise RuntimeError(f"the minimal commit server answered {answer}")
        return elapsed

    return commit


Series = dict[str, Callable[[], Awaitable[float]]]


async def alternate(
    series: Series, n: int, block_size: int = BLOCK, cpu_of: dict[str, int] | None = None
) -> dict[str, Summary]:
    """Warm each series up, then run them in turns of `block_size` samples until each has n;
    every other round in reverse order, so no series always follows the same one.

    `cpu_of`: series name -> the server process whose CPU seconds during that series' blocks
    are added up (Summary.cpu, per sample)."""
    cpu_of = cpu_of or {}
    for measure in series.values():
        for _ in range(WARMUP):
            await measure()
    samples: dict[str, list[float]] = {name: [] for name in series}
    cpu: dict[str, float] = dict.fromkeys(cpu_of, 0.0)
    done, turns = 0, list(series.items())
    while done < n:
        block = min(block_size, n - done)
        for name, measure in turns:
            pid = cpu_of.get(name)
            before = process_cpu(pid) if pid else 0.0
            samples[name] += [await measure() for _ in range(block)]
            if pid:
                cpu[name] += process_cpu(pid) - before
        done += block
        turns.reverse()
    summaries = {name: Summary.of(values) for name, values in samples.items()}
    for name, seconds in cpu.items():
        summaries[name] = dataclasses.replace(summaries[name], cpu=seconds / n)
    return summaries


async def _measure(
    dsn: str, cp_port: int, floor_port: int, n: int, pids: dict[str, int]
) -> dict[str, Summary]:
    conn = await asyncpg.connect(dsn)
    pool = await create_pool(dsn)
    try:
        await conn.execute(RAW_TABLE)
        keys = await api.mint_keys(dsn)
        # Connect authenticates once, when the stream opens: with the executor credential,
        # in the call's metadata. The stream's channel has no client interceptor, as the
        # executor's has none (executor/transport.py): grpc.aio runs an intercepted stream's
        # writes and reads through a queue and a task of its own, which cost this series
        # 0.2-0.3 ms a commit that no executor pays. Health, the ping, needs no credential.
        async with (
            api.channel(cp_port, keys.admin) as chan,
            api.channel(cp_port, None) as executor_chan,
            api.channel(floor_port, None) as floor_chan,
        ):
            floor = floor_probes(floor_chan)
            floor[MINIMAL] = minimal_committer(floor_chan)
            return await _measure_with(
                chan, executor_chan, keys.executor, conn, pool, n, floor, pids
            )
    finally:
        await conn.close()
        await pool.close()


async def _measure_with(
    chan: grpc.aio.Channel,
    executor_chan: grpc.aio.Channel,
    executor_key: str,
    conn: asyncpg.Connection,
    pool: asyncpg.pool.Pool,
    n: int,
    floor: Series,
    pids: dict[str, int],
) -> dict[str, Summary]:
    await api.publish_agent(chan, "commit", model="steps10", tools=[])
    await api.start_run(chan, "commit", "commit benchmark")
    # Connect authenticates once, when the stream opens: with the executor credential.
    ours = StreamExecutor(executor_chan, key=executor_key)
    try:
        await ours.take_run()
        # Started only now: the stream executor has no credit left, so the dispatcher
        # leaves this run queued for the direct series to claim.
        await api.start_run(chan, "commit", "direct store series")
        direct = StoreCommitter(pool)
        await direct.claim()
        raw = RawInserter(conn)
        series = {OURS: ours.commit_one, RAW: raw.insert_one, MINIMAL: floor.pop(MINIMAL)}
        echo = floor[FLOOR_STREAM]
        info = {
            DIRECT: direct.commit_one,
            DIRECT_AFTER_HOP: after_hop(direct.commit_one, echo),
            RAW_AFTER_HOP: after_hop(raw.insert_one, echo),
            PING: health_probe(executor_chan),
            **floor,
        }
        return await alternate({**series, **info}, n, cpu_of=pids)
    finally:
        ours.close()


def _print(results: dict[str, Summary]) -> None:
    report.table(report.LATENCY_HEADERS, [report.latency_row(k, v) for k, v in results.items()])
    ours, raw = results[OURS], results[RAW]
    for label, ours_v, raw_v in (("p50", ours.p50, raw.p50), ("p99", ours.p99, raw.p99)):
        r = ratio(ours_v, raw_v)
        report.target(f"commit {label} ours/raw", r, f"<= {TARGET:g}x", r <= TARGET)
    minimal = results[MINIMAL]
    r = ratio(ours.p50, minimal.p50)
    report.target(
        "commit p50 ours/minimal server", r, f"<= {TARGET_MINIMAL:g}x", r <= TARGET_MINIMAL
    )
    r = ratio(ours.cpu, minimal.cpu)
    report.target(
        "server CPU/commit ours/minimal", r, f"<= {TARGET_MINIMAL_CPU:g}x", r <= TARGET_MINIMAL_CPU
    )
    report.note(
        f"server CPU per commit, over each series' blocks: agentrun's control plane "
        f"{ours.cpu * 1e6:,.0f} us (stream, task, pricing, group commit, metrics, answer), the "
        f"minimal commit server {minimal.cpu * 1e6:,.0f} us (stream message, decode, INSERT, "
        f"answer); p50 {report.ms(ours.p50)} ms against {report.ms(minimal.p50)} ms"
    )
    floor = results[FLOOR_STREAM]
    # A commit is at least a stream message round trip plus the INSERT's own round trip.
    reachable = ratio(floor.p50 + raw.p50, raw.p50)
    report.note(
        f"how close the transport lets us get: a bare stream message round trip is "
        f"{ratio(floor.p50, raw.p50):.2f}x the raw insert, so floor + insert = "
        f"{reachable:.2f}x at best"
    )
    direct, cold = results[DIRECT], results[DIRECT_AFTER_HOP]
    report.note(
        f"where ours' p50 goes: the fenced store commit in-process {report.ms(direct.p50)} ms "
        f"({ratio(direct.p50, raw.p50):.2f}x the raw insert: lease check, run row update and "
        f"step insert); {report.ms(cold.p50)} ms each after a stream echo, as the control "
        "plane makes it, the database idle between two statements (the raw insert so: "
        f"{report.ms(results[RAW_AFTER_HOP].p50)} ms)"
    )
    rest = ours.p50 - floor.p50 - cold.p50
    report.note(
        f"ours = the stream message {report.ms(floor.p50)} + that commit {report.ms(cold.p50)}"
        f" + {report.ms(rest)} ms in the control plane (waking it, decoding, checks, pricing, "
        "the result): 2x needs a commit path without that extra process and its hops, "
        "which is not this architecture"
    )


async def main(quick: bool = False) -> None:
    n = 300 if quick else 2000
    report.heading(f"commit: per-step commit round trip, {n} sequential commits")
    with workdir("commit") as tmp:
        async with bench_postgres() as pg:
            dsn = await pg.create_database("commit")
            report.note(await durability(dsn))
            with Procs(tmp) as procs:
                cp, port = await start_control_plane(procs, dsn)
                floor, floor_port = await start_grpc_floor(procs, dsn)
                pids = {OURS: cp.pid, MINIMAL: floor.pid}
                results = await _measure(dsn, port, floor_port, n, pids)
    _print(results)


def run(quick: bool = False) -> None:
    asyncio.run(main(quick))
