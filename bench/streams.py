"""Durable Streams: many live readers of one stream on one replica (docs/streams.md).

Real processes: Postgres and one control plane. A JSON stream of the bench workspace has
READERS live SSE readers (`?offset=now&live=sse`, one httpx client, one connection each),
all on the one replica; once each has its first control event, APPENDS appends go in one
every APPEND_EVERY seconds, each carrying the wall-clock time it was sent. For every
(reader, append) pair: the time from just before the POST to the reader parsing the
`data` event (one machine, one clock: the readers run in this process, so their own
parsing is in the figure). The control plane's and Postgres's CPU seconds over the append
phase are divided by the events delivered. The machine's load average is printed too.

Every append wakes each reader (LISTEN/NOTIFY), and each reads the stream again from its
own offset: the cost per delivered event is a few statements, which this measures.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field

import httpx

from bench import api, cpu, report
from bench.postgres import bench_postgres
from bench.procs import Procs, workdir
from bench.services import start_control_plane
from bench.stats import Summary

APPEND_EVERY = 0.2
CONNECT_DEADLINE = 120.0
DELIVERY_DEADLINE = 60.0


@dataclass
class Reader:
    latencies: list[float] = field(default_factory=list)
    ready: asyncio.Event = field(default_factory=asyncio.Event)


async def read(client: httpx.AsyncClient, url: str, reader: Reader, appends: int) -> None:
    """One SSE reader: ready at its first control event; the latency of each data event."""
    async with client.stream("GET", url, params={"offset": "now", "live": "sse"}) as res:
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
                    reader.latencies.append(got - value["t"])
                if len(reader.latencies) >= appends:
                    return


async def measure(readers: int, appends: int) -> None:
    async with bench_postgres() as pg:
        dsn = await pg.create_database("streams")
        with workdir("streams") as tmp, Procs(tmp) as procs:
            port_file = tmp / "http.port"
            cp, _ = await start_control_plane(procs, dsn, AGENTRUN_HTTP_PORT_FILE=str(port_file))
            keys = await api.mint_keys(dsn)
            base = f"http://127.0.0.1:{port_file.read_text().strip()}"
            url = f"{base}/v1/workspaces/{api.WORKSPACE}/streams/bench/live"
            limits = httpx.Limits(max_connections=readers + 10, max_keepalive_connections=0)
            headers = {"authorization": f"Bearer {keys.admin}"}
            async with httpx.AsyncClient(headers=headers, timeout=None, limits=limits) as client:
                made = await client.put(url, headers={"content-type": "application/json"})
                made.raise_for_status()
                group = [Reader() for _ in range(readers)]
                tasks = [asyncio.create_task(read(client, url, r, appends)) for r in group]
                await asyncio.wait_for(
                    asyncio.gather(*(r.ready.wait() for r in group)), CONNECT_DEADLINE
                )
                cp_before, pg_before = cpu.process_cpu(cp.pid), _pg_cpu(pg)
                began = time.monotonic()
                for i in range(appends):
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
    _print(group, readers, appends, took, cp_used, pg_used)


def _pg_cpu(pg: object) -> float:
    pid = getattr(pg, "server_pid", None)
    return cpu.tree_cpu(pid) if pid else 0.0


def _print(
    group: list[Reader], readers: int, appends: int, took: float, cp_used: float, pg_used: float
) -> None:
    latencies = [x for r in group for x in r.latencies]
    delivered = len(latencies)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    report.note(f"load average {load} on {os.cpu_count()} cores; {took:.1f} s append phase")
    report.table(
        report.LATENCY_HEADERS,
        [report.latency_row("append -> SSE data event at the reader", Summary.of(latencies))],
    )
    per_event = 1000 * (cp_used + pg_used) / max(delivered, 1)
    report.note(
        f"{delivered} of {readers * appends} events delivered; CPU per delivered event "
        f"{per_event:.2f} ms (control plane {cp_used:.1f} s, Postgres {pg_used:.1f} s)"
    )


def run(quick: bool = False) -> None:
    readers, appends = (100, 10) if quick else (1000, 25)
    report.heading(f"streams: {readers} live SSE readers of one stream, {appends} appends")
    asyncio.run(measure(readers, appends))
