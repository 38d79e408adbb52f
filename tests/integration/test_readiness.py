"""Readiness follows Postgres: /readyz and the gRPC health service go unready within 5 s of the
database going away and ready again once it is back; /healthz (liveness) never looks at it.

The control plane is a real process; the session's embedded PostgreSQL is really stopped
(a clean shutdown, then a crash) and started again on the same port.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit, urlunsplit

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from control_plane.ops.readiness import Readiness
from control_plane.store.db import create_pool
from tests.harness.tcp_proxy import TcpProxy
from tests.harness.waiting import eventually

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Probe:
    """What a load balancer asks: /readyz, /healthz and grpc.health.v1.Health/Check."""

    def __init__(self, http_url: str, address: str) -> None:
        self._http = httpx.AsyncClient(base_url=http_url, timeout=3)
        self._channel = grpc.aio.insecure_channel(address)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    async def ready(self) -> int:
        return (await self._http.get("/readyz")).status_code

    async def readiness(self) -> dict[str, str]:
        return (await self._http.get("/readyz")).json()

    async def alive(self) -> int:
        return (await self._http.get("/healthz")).status_code

    async def health(self, service: str = "") -> int:
        reply = await self._health.Check(health_pb2.HealthCheckRequest(service=service), timeout=3)
        return reply.status

    async def state(self) -> tuple[int, int, int]:
        run_service = await self.health("agentrun.v1.RunService")
        return await self.ready(), await self.health(), run_service

    async def close(self) -> None:
        await self._http.aclose()
        await self._channel.close()


@pytest.mark.parametrize("how", ["stop", "kill"])
async def test_readiness_follows_postgres_down_and_back(db_url, control_plane, embedded_pg, how):
    cp = control_plane(db_url)
    probe = Probe(cp.http_url, cp.address)
    try:
        assert await probe.state() == (200, SERVING, SERVING)
        getattr(embedded_pg, how)()
        gone = time.monotonic()

        async def unready() -> bool:
            return await probe.state() == (503, NOT_SERVING, NOT_SERVING)

        await eventually(unready, timeout=10, interval=0.1, message="still ready without Postgres")
        assert time.monotonic() - gone < 5.0
        assert await probe.alive() == 200  # liveness: restarting the replica would not help
        assert await probe.readiness() == {
            "status": "unready",
            "database": "unreachable",
        }

        embedded_pg.start()

        async def ready() -> bool:
            return await probe.state() == (200, SERVING, SERVING)

        await eventually(
            ready, timeout=15, interval=0.1, message="not ready after Postgres came back"
        )
    finally:
        await probe.close()


def _through(db_url: str, proxy: TcpProxy) -> str:
    """db_url with the proxy's address in place of the database's."""
    url = urlsplit(db_url)
    netloc = url.netloc.replace(f"{url.hostname}:{url.port}", proxy.address)
    return urlunsplit(url._replace(netloc=netloc))


async def _db_proxy(db_url: str) -> TcpProxy:
    url = urlsplit(db_url)
    return await TcpProxy(f"{url.hostname}:{url.port}").start()


async def test_a_silent_database_is_unready_at_the_timeout_not_when_the_ping_gives_up(db_url):
    """The ping that is out when the database goes silent is not waited for: its
    cancellation would hang until the pool's command timeout (30 s)."""
    proxy = await _db_proxy(db_url)
    pool = await create_pool(_through(db_url, proxy), min_size=1, max_size=4)
    readiness = Readiness(pool, ttl=0.0, timeout=1.0)
    try:
        assert await readiness.ready()
        proxy.black_hole()
        began = time.monotonic()
        assert not await readiness.ready()
        assert not await readiness.ready()  # the first ping is still out: no second one
        assert time.monotonic() - began < 3.0
        proxy.heal()
        await eventually(
            readiness.ready, timeout=5, interval=0.1, message="not ready once the database answered"
        )
    finally:
        proxy.heal()
        await pool.close()
        await proxy.close()


async def test_readiness_notices_a_silent_database_and_its_return(db_url, control_plane):
    """A control plane whose Postgres is behind a proxy that black-holes it (packets
    dropped, no reset, no refusal): NOT_SERVING within 5 s of the cut, SERVING within 5 s
    of the heal, on /readyz and the gRPC health service alike."""
    proxy = await _db_proxy(db_url)
    # Started in a thread: it waits until ready, and the proxy pumps in this event loop.
    cp = await asyncio.to_thread(control_plane, _through(db_url, proxy))
    probe = Probe(cp.http_url, cp.address)

    async def state_is(expected: tuple[int, int, int]) -> bool:
        return await probe.state() == expected

    try:
        assert await probe.state() == (200, SERVING, SERVING)
        proxy.black_hole()
        cut = time.monotonic()
        await eventually(
            lambda: state_is((503, NOT_SERVING, NOT_SERVING)),
            timeout=15,
            interval=0.1,
            message="still ready with Postgres silent",
        )
        noticed = time.monotonic() - cut
        proxy.heal()
        healed = time.monotonic()
        await eventually(
            lambda: state_is((200, SERVING, SERVING)),
            timeout=15,
            interval=0.1,
            message="not ready after Postgres answered again",
        )
        back = time.monotonic() - healed
        print(f"silent database: unready after {noticed:.2f}s, ready {back:.2f}s after the heal")
        assert noticed < 5.0 and back < 5.0
    finally:
        proxy.heal()
        await probe.close()
        await proxy.close()
