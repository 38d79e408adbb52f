"""Readiness follows Postgres: /readyz and the gRPC health service go unready within 5 s of the
database going away and ready again once it is back; /healthz (liveness) never looks at it.

The control plane is a real process; the session's embedded PostgreSQL is really stopped
(a clean shutdown, then a crash) and started again on the same port.
"""

from __future__ import annotations

import time

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

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
