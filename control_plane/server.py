"""Assembles the grpc.aio server: servicers, interceptors, health, reflection, graceful stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from agentrun.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    approval_pb2,
    approval_pb2_grpc,
    executor_pb2,
    executor_pb2_grpc,
    run_pb2,
    run_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
    trigger_pb2,
    trigger_pb2_grpc,
)
from control_plane.api.agents import AgentServicer
from control_plane.api.approvals import ApprovalServicer
from control_plane.api.runs import RunServicer
from control_plane.api.sessions import Conversations, SessionServicer
from control_plane.api.triggers import TriggerServicer
from control_plane.approvals import expiry, relay
from control_plane.approvals.relay import RelayConfig
from control_plane.config import ServerConfig
from control_plane.dispatch.dispatcher import Dispatcher
from control_plane.dispatch.session import ExecutorSession
from control_plane.errors import ErrorInterceptor
from control_plane.http.app import build_app
from control_plane.http.context import HttpContext
from control_plane.http.server import HttpIngress
from control_plane.scheduler import Scheduler
from control_plane.store.db import create_pool
from control_plane.triggers.push import PushFetcher

log = logging.getLogger(__name__)

SERVICE_NAMES = (
    agent_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name,
    run_pb2.DESCRIPTOR.services_by_name["RunService"].full_name,
    executor_pb2.DESCRIPTOR.services_by_name["ExecutorService"].full_name,
    approval_pb2.DESCRIPTOR.services_by_name["ApprovalService"].full_name,
    trigger_pb2.DESCRIPTOR.services_by_name["TriggerService"].full_name,
    session_pb2.DESCRIPTOR.services_by_name["SessionService"].full_name,
)


class ExecutorServicer(executor_pb2_grpc.ExecutorServiceServicer):
    def __init__(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher

    async def Connect(
        self,
        request_iterator: AsyncIterator[executor_pb2.ConnectRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[executor_pb2.ConnectResponse]:
        session = ExecutorSession(self._dispatcher)
        async for msg in session.serve(request_iterator):
            yield msg


@dataclass
class RunningServer:
    server: grpc.aio.Server
    port: int
    pool: asyncpg.pool.Pool
    # Background loops of this replica: dispatcher, approval expiry, outbox relay,
    # scheduler, push fetcher.
    tasks: list[asyncio.Task[None]]
    # The HTTP ingress (webhooks, sessions) on its own port.
    http: HttpIngress | None = None

    @property
    def http_port(self) -> int:
        return self.http.port if self.http is not None else 0

    async def stop(self, grace: float = 5.0) -> None:
        await self.server.stop(grace)
        if self.http is not None:
            await self.http.stop()
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.pool.close()


async def start(config: ServerConfig) -> RunningServer:
    """Start serving; returns once the port is bound."""
    pool = await create_pool(config.database_url)
    dispatcher = Dispatcher(pool, config)
    server = grpc.aio.server(
        interceptors=[ErrorInterceptor()],
        options=[
            ("grpc.max_receive_message_length", config.max_message_bytes),
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
            ("grpc.keepalive_time_ms", 20_000),
            ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
            ("grpc.keepalive_permit_without_calls", 1),
        ],
    )
    agent_pb2_grpc.add_AgentServiceServicer_to_server(AgentServicer(pool), server)
    run_pb2_grpc.add_RunServiceServicer_to_server(
        RunServicer(pool, config.defaults, dispatcher.poke, dispatcher.cancel), server
    )
    executor_pb2_grpc.add_ExecutorServiceServicer_to_server(ExecutorServicer(dispatcher), server)
    approval_pb2_grpc.add_ApprovalServiceServicer_to_server(ApprovalServicer(pool), server)
    trigger_pb2_grpc.add_TriggerServiceServicer_to_server(
        TriggerServicer(pool, config.public_url), server
    )
    session_pb2_grpc.add_SessionServiceServicer_to_server(
        SessionServicer(Conversations(pool, config.defaults, dispatcher.poke)), server
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    port = server.add_insecure_port(config.listen)
    if port == 0:
        raise SystemExit(f"cannot listen on {config.listen}")
    await server.start()
    for name in ("", *SERVICE_NAMES):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    relay_cfg = RelayConfig(config.notify_url, config.public_url)
    tasks = [
        asyncio.create_task(dispatcher.run(), name="dispatcher"),
        asyncio.create_task(
            expiry.run_forever(pool, config.approval_poll_seconds, dispatcher.poke),
            name="approval-expiry",
        ),
        asyncio.create_task(relay.run_forever(pool, relay_cfg), name="outbox-relay"),
    ]
    http, trigger_tasks = await _start_triggers(pool, config, dispatcher)
    return RunningServer(server, port, pool, tasks + trigger_tasks, http)


async def _start_triggers(
    pool: asyncpg.pool.Pool, config: ServerConfig, dispatcher: Dispatcher
) -> tuple[HttpIngress, list[asyncio.Task[None]]]:
    """The HTTP ingress, the scheduler and the push fetcher of this replica."""
    scheduler = Scheduler(
        pool, config.defaults, dispatcher.poke,
        poll_seconds=config.scheduler_poll_seconds, catchup_seconds=config.schedule_catchup_seconds,
    )  # fmt: skip
    fetcher = PushFetcher(
        pool, config.defaults, dispatcher.poke, poll_seconds=config.push_poll_seconds
    )
    ctx = HttpContext(pool, config, on_runnable=dispatcher.poke, on_fetch_queued=fetcher.poke)
    http = HttpIngress(build_app(ctx), config.http_listen)
    await http.start()
    return http, [
        asyncio.create_task(scheduler.run(), name="scheduler"),
        asyncio.create_task(fetcher.run(), name="push-fetcher"),
    ]


def _write_port_file(path: str, port: int) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.replace(tmp, path)


async def serve(config: ServerConfig) -> None:
    """Serve until SIGTERM or SIGINT, then stop gracefully."""
    running = await start(config)
    log.info("control plane serving on %s (port %d)", config.listen, running.port)
    log.info("HTTP ingress on port %d", running.http_port)
    # The HTTP port file first: whoever waits for the gRPC one may then read both.
    if config.http_port_file:
        _write_port_file(config.http_port_file, running.http_port)
    if config.port_file:
        _write_port_file(config.port_file, running.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("control plane stopping")
    await running.stop()


def main() -> None:
    logging.basicConfig(
        level=os.environ.get("AGENTRUN_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    asyncio.run(serve(ServerConfig.from_env()))
