"""Assembles the grpc.aio server: servicers, interceptors, health, reflection, graceful stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from agentrun.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    agent_pb2,
    agent_pb2_grpc,
    approval_pb2,
    approval_pb2_grpc,
    channel_pb2,
    channel_pb2_grpc,
    connection_pb2,
    connection_pb2_grpc,
    credit_pb2,
    credit_pb2_grpc,
    executor_pb2,
    executor_pb2_grpc,
    release_pb2_grpc,
    run_pb2,
    run_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
    stream_pb2,
    stream_pb2_grpc,
    tool_pb2,
    tool_pb2_grpc,
    trigger_pb2,
    trigger_pb2_grpc,
)
from control_plane.api import payloads
from control_plane.api.admin import AdminServicer
from control_plane.api.agents import AgentServicer
from control_plane.api.approvals import ApprovalServicer
from control_plane.api.channels import ChannelServicer
from control_plane.api.connections import ConnectionServicer, connection_token
from control_plane.api.mcp_servers import McpServerServicer
from control_plane.api.runs import RunServicer
from control_plane.api.sessions import Conversations, SessionServicer
from control_plane.api.streams import StreamServicer
from control_plane.api.tools import ToolServicer
from control_plane.api.triggers import TriggerServicer
from control_plane.approvals import expiry, needs_help, relay, unknown_outcome
from control_plane.approvals.commit import ApprovalHold
from control_plane.approvals.relay import RelayConfig
from control_plane.auth import context as auth_context
from control_plane.auth import oidc
from control_plane.auth.interceptor import IdentityInterceptor
from control_plane.auth.oidc import OidcVerifier
from control_plane.auth.principal import Principal
from control_plane.auth.resolver import REFUSED, Resolver
from control_plane.channels import alerts, lifecycle
from control_plane.connections import parks
from control_plane.connections.client import OAuthClient, OAuthSettings
from control_plane.connections.flows import ConnectionFlows
from control_plane.connections.revocation import Revocations
from control_plane.connections.tokens import ConnectionTokens
from control_plane.credits import pricing
from control_plane.credits.service import CreditServicer
from control_plane.credits.top_up import TopUp
from control_plane.crypto import kms
from control_plane.crypto.envelope import Envelope
from control_plane.deploys import releases
from control_plane.deploys.canary import CANARY_WORKSPACE, Canary, CanaryServicer
from control_plane.deploys.self_check import SelfCheck
from control_plane.dispatch import commits, delta_store, fast_path, max_age
from control_plane.dispatch.delta_store import DeltaStore
from control_plane.dispatch.deltas import DeltaHub
from control_plane.dispatch.dispatcher import Dispatcher
from control_plane.dispatch.fast_path import FastPath
from control_plane.dispatch.pipeline import CommitPipeline
from control_plane.dispatch.session import ExecutorSession
from control_plane.ground.config import ServerConfig
from control_plane.ground.errors import ErrorInterceptor
from control_plane.http.app import build_app
from control_plane.http.context import HttpContext
from control_plane.http.server import HttpIngress
from control_plane.http.services import Services
from control_plane.ops import logs, run_figures
from control_plane.ops.readiness import Readiness
from control_plane.ops.refusal_figures import RefusalFigures
from control_plane.ops.tls import add_port, check_transport, http_files, server_credentials
from control_plane.runs import children, events, signals, wait_limits
from control_plane.runs.retention import Retention
from control_plane.store.db import Pool, create_pool
from control_plane.tools import builtins, registry
from control_plane.tools.guard import PublishGuard
from control_plane.triggers import sealed_secrets
from control_plane.triggers.push import PushFetcher
from control_plane.triggers.scheduler import Scheduler
from telemetry import event_loop, grpc_trace, tracing

log = logging.getLogger(__name__)
# How often a replica fails the runs waiting past their kind's limit (runs/wait_limits.py).
WAIT_LIMIT_POLL_SECONDS = 30.0

SERVICE_NAMES = (
    agent_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name,
    run_pb2.DESCRIPTOR.services_by_name["RunService"].full_name,
    executor_pb2.DESCRIPTOR.services_by_name["ExecutorService"].full_name,
    approval_pb2.DESCRIPTOR.services_by_name["ApprovalService"].full_name,
    trigger_pb2.DESCRIPTOR.services_by_name["TriggerService"].full_name,
    session_pb2.DESCRIPTOR.services_by_name["SessionService"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["WorkspaceAdminService"].full_name,
    connection_pb2.DESCRIPTOR.services_by_name["ConnectionService"].full_name,
    channel_pb2.DESCRIPTOR.services_by_name["ChannelService"].full_name,
    credit_pb2.DESCRIPTOR.services_by_name["CreditService"].full_name,
    # The registry (issue 18); McpServerService's servicer is added by control_plane/mcp.
    tool_pb2.DESCRIPTOR.services_by_name["ToolService"].full_name,
    tool_pb2.DESCRIPTOR.services_by_name["McpServerService"].full_name,
    *releases.SERVICE_NAMES,
    # Durable Streams over gRPC (issue 42, docs/streams.md).
    stream_pb2.DESCRIPTOR.services_by_name["StreamService"].full_name,
)
EXECUTOR_SERVICE = executor_pb2.DESCRIPTOR.services_by_name["ExecutorService"].full_name
# What the public listener serves when executors have a listener of their own.
PUBLIC_SERVICE_NAMES = tuple(name for name in SERVICE_NAMES if name != EXECUTOR_SERVICE)


class ExecutorServicer(executor_pb2_grpc.ExecutorServiceServicer):
    """Connect: the interceptor authenticated the stream once, as an executor credential."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        resolver: Resolver,
        tokens: ConnectionTokens,
        pipeline: CommitPipeline,
        recheck_seconds: float = 2.0,
    ) -> None:
        self._dispatcher = dispatcher
        self._pipeline = pipeline
        self._resolver = resolver
        self._tokens = tokens
        self._recheck = recheck_seconds
        self._max_payload = dispatcher.config.max_payload_bytes

    async def PutPayloadChunk(
        self, request: executor_pb2.PutPayloadChunkRequest, context: grpc.aio.ServicerContext
    ) -> executor_pb2.PutPayloadChunkResponse:
        return await payloads.put_chunk(self._dispatcher.pool, request, self._max_payload)

    async def GetPayloadSlice(
        self, request: executor_pb2.GetPayloadSliceRequest, context: grpc.aio.ServicerContext
    ) -> executor_pb2.GetPayloadSliceResponse:
        return await payloads.get_slice(self._dispatcher.pool, request, self._max_payload)

    async def GetConnectionToken(
        self,
        request: executor_pb2.GetConnectionTokenRequest,
        context: grpc.aio.ServicerContext,
    ) -> executor_pb2.GetConnectionTokenResponse:
        return await connection_token(self._dispatcher.pool, self._tokens, request)

    async def Connect(
        self,
        request_iterator: AsyncIterator[executor_pb2.ConnectRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[executor_pb2.ConnectResponse]:
        who = auth_context.current()
        # Every executor may run the contract canary, whatever workspaces it serves.
        scope = who.scope | {CANARY_WORKSPACE} if who.scope is not None else None
        session = ExecutorSession(self._dispatcher, scope, self._pipeline)
        watch = asyncio.create_task(self._watch(session, who))
        try:
            async for msg in session.serve(request_iterator):
                yield msg
        finally:
            watch.cancel()
        if watch.done() and not watch.cancelled() and watch.result():
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSED)

    async def _watch(self, session: ExecutorSession, who: Principal) -> bool:
        """End the stream once its credential is revoked or expires; True when it did."""
        while True:
            await asyncio.sleep(self._recheck)
            with contextlib.suppress(Exception):  # a database blip is not a revocation
                if not await self._resolver.still_valid(who):
                    log.info("executor credential %s revoked: ending its stream", who.name)
                    session.close()
                    return True


def commit_pipeline(pool: Pool, config: ServerConfig, poke: Callable[[], None]) -> CommitPipeline:
    """The replica's commit pipeline: commits are priced by the credits' table, and each
    feature registers the effect of the commits that call for it (dispatch/pipeline.py)."""
    pipeline = CommitPipeline(pool, price=pricing.priced, on_runnable=poke)
    pipeline.on_field("approval_request", ApprovalHold())
    pipeline.on_park(parks.WAIT_REASON, parks.ConnectionPark())
    pipeline.on_park(needs_help.REPEAT_WAIT, needs_help.HeldRepeat())
    pipeline.on_park(unknown_outcome.WAIT_REASON, unknown_outcome.UnknownOutcomePark())
    pipeline.on_park(children.WAIT_REASON, children.StartChild(config.defaults))
    pipeline.on_park(children.WAIT_REASON, children.StartChildren(config.defaults))
    pipeline.on_park(signals.WAIT_REASON, signals.SignalWait())
    pipeline.on_park(events.WAIT_REASON, events.EventWait())
    pipeline.after_commit(TopUp())
    pipeline.after_commit(run_figures.FIGURES)  # after the top-up: it may end the run
    pipeline.after_commit(RefusalFigures())
    return pipeline


def publish_guard(config: ServerConfig) -> PublishGuard:
    """Publish-time tool checks: executors count as connected for a few leases."""
    return PublishGuard(
        live_seconds=registry.LIVE_LEASES * config.lease_seconds,
        catalogue=registry.load_catalogue(),
        trifecta_policy=config.trifecta_policy,
    )


@dataclass
class RunningServer:
    server: grpc.aio.Server
    port: int
    pool: Pool
    # Background loops of this replica: dispatcher, approval expiry, outbox relay,
    # max-age sweep, scheduler, push fetcher.
    tasks: list[asyncio.Task[None]]
    # The HTTP ingress (webhooks, sessions) on its own port.
    http: HttpIngress | None = None
    # ExecutorService's own server (AGENTRUN_EXECUTOR_LISTEN); None when `server` serves it.
    executor_server: grpc.aio.Server | None = None
    executor_port: int = 0
    # The replica's one OIDC verifier (the resolver's and the approval routes'); None: no sign-in.
    verifier: OidcVerifier | None = None
    # The OAuth client of connected accounts (closed on stop).
    oauth: OAuthClient | None = None

    @property
    def http_port(self) -> int:
        return self.http.port if self.http is not None else 0

    async def stop(self, grace: float = 5.0) -> None:
        if self.executor_server is not None:
            await self.executor_server.stop(grace)
        await self.server.stop(grace)
        if self.http is not None:
            await self.http.stop()
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.verifier is not None:
            await self.verifier.close()
        if self.oauth is not None:
            await self.oauth.close()
        await commits.close_for(self.pool)  # the connections its commits hold, first
        await self.pool.close()


@dataclass(frozen=True)
class _Parts:
    """What one replica's servicers and loops share."""

    config: ServerConfig
    pool: Pool
    dispatcher: Dispatcher
    envelope: Envelope
    resolver: Resolver
    tokens: ConnectionTokens
    canary: Canary
    # The release self-check on each executor's connect; None with the gate off.
    self_check: SelfCheck | None


def _deploys(
    pool: Pool, config: ServerConfig, dispatcher: Dispatcher
) -> tuple[Canary, SelfCheck | None]:
    """The contract canary, and with the release gate on the self-check each executor's
    connect starts (a callback the dispatcher calls as it registers the stream)."""
    canary = Canary(dispatcher)
    self_check = SelfCheck(canary, pool) if config.release_gate else None
    if self_check is not None:
        dispatcher.on_register(self_check.connected)
    return canary, self_check


async def start(
    config: ServerConfig,
    identity: Callable[[Resolver], grpc.aio.ServerInterceptor] = IdentityInterceptor,
) -> RunningServer:
    """Start serving; returns once the port is bound.

    `identity` builds the authenticating interceptor; only bench/auth.py's labelled,
    unauthenticated baseline passes another (never a shipped mode).
    """
    check_transport(config)
    key_service = kms.configured(config.kms, config.kms_key_file, release=config.release)
    pool = await create_pool(config.database_url)
    try:
        return await _start_on(config, identity, key_service, pool)
    except BaseException:
        # A setting found wrong past this point (a TLS key that cannot be read, a port in
        # use) must not leave the pool reconnecting in the background of a caller that
        # goes on: `agentrun dev`, a test, an embedding.
        pool.terminate()
        raise


async def _start_on(
    config: ServerConfig,
    identity: Callable[[Resolver], grpc.aio.ServerInterceptor],
    key_service: kms.Kms,
    pool: Pool,
) -> RunningServer:
    envelope = Envelope(pool, key_service)
    # Secrets stored in plain text before envelope encryption: sealed before anything serves.
    await sealed_secrets.backfill(pool, envelope)
    # The platform catalogue as the registry's shared entries (idempotent: equal saves nothing).
    await builtins.sync(pool)
    # One verifier per replica: gRPC, the HTTP guard and signed-in decisions share its JWKS cache.
    verifier = oidc.from_settings(config.oidc_issuer, config.oidc_audience)
    resolver = Resolver(pool, verifier, ttl=config.key_cache_seconds)
    oauth, tokens = _connections(config, pool, envelope)
    dispatcher = Dispatcher(pool, config)
    parts = _Parts(
        config, pool, dispatcher, envelope, resolver, tokens, *_deploys(pool, config, dispatcher)
    )
    # Both gRPC servers (public, executor) run the same interceptors; the error
    # interceptor outside, so it maps what the identity one raises.
    interceptors: list[grpc.aio.ServerInterceptor] = [
        grpc_trace.ServerTracing(),  # outermost: its span sees the status the call ends with
        ErrorInterceptor(),
        identity(resolver),
    ]
    server = grpc.aio.server(interceptors=interceptors, options=_grpc_options(config))
    executors = _executor_server(config, interceptors) or server
    services = _add_servicers(parts, server, executors)
    healths: list[_Health] = []
    port, executor_port = await _listen(config, server, executors, healths)
    flows = ConnectionFlows(pool, envelope, oauth, tokens, config.public_url)
    # One readiness per replica: /readyz and the gRPC health service say the same.
    readiness = Readiness(pool)
    http, trigger_tasks = await _start_triggers(
        pool, config, parts.dispatcher, envelope, resolver, flows, readiness, services
    )
    watch = asyncio.create_task(readiness.watch(healths), name="readiness")
    return RunningServer(
        server,
        port,
        pool,
        [*_background_loops(parts), *trigger_tasks, watch],
        http,
        executor_server=executors if executors is not server else None,
        executor_port=executor_port,
        verifier=verifier,
        oauth=oauth,
    )


def _add_servicers(p: _Parts, server: grpc.aio.Server, executors: grpc.aio.Server) -> Services:
    """Every public service on `server`; ExecutorService on `executors` (maybe the same).
    Returns those the HTTP/JSON API serves too (control_plane/http/api.py)."""
    cfg, pool, dispatcher = p.config, p.pool, p.dispatcher
    services = Services(
        runs=RunServicer(
            pool,
            cfg.defaults,
            dispatcher.poke,
            dispatcher.cancel,
            dispatcher.deltas,
            on_pause=dispatcher.pause,
        ),
        approvals=ApprovalServicer(pool),
        sessions=SessionServicer(
            Conversations(
                pool, cfg.defaults, dispatcher.poke, dispatcher.cancel, FastPath(dispatcher)
            )
        ),
        agents=AgentServicer(pool, publish_guard(cfg)),
    )
    agent_pb2_grpc.add_AgentServiceServicer_to_server(services.agents, server)
    run_pb2_grpc.add_RunServiceServicer_to_server(services.runs, server)
    pipeline = commit_pipeline(pool, cfg, dispatcher.poke)
    executor_pb2_grpc.add_ExecutorServiceServicer_to_server(
        ExecutorServicer(dispatcher, p.resolver, p.tokens, pipeline), executors
    )
    connection_pb2_grpc.add_ConnectionServiceServicer_to_server(
        ConnectionServicer(pool, cfg.public_url, Revocations(pool, p.envelope, p.tokens.client)),
        server,
    )
    approval_pb2_grpc.add_ApprovalServiceServicer_to_server(services.approvals, server)
    channel_pb2_grpc.add_ChannelServiceServicer_to_server(ChannelServicer(pool, p.envelope), server)
    trigger_pb2_grpc.add_TriggerServiceServicer_to_server(
        TriggerServicer(
            pool, cfg.public_url, p.envelope, cfg.defaults, dispatcher.poke, dispatcher.cancel
        ),
        server,
    )
    session_pb2_grpc.add_SessionServiceServicer_to_server(services.sessions, server)
    admin_pb2_grpc.add_WorkspaceAdminServiceServicer_to_server(AdminServicer(pool), server)
    credit_pb2_grpc.add_CreditServiceServicer_to_server(CreditServicer(pool), server)
    tool_pb2_grpc.add_ToolServiceServicer_to_server(ToolServicer(pool), server)
    tool_pb2_grpc.add_McpServerServiceServicer_to_server(McpServerServicer(pool, p.tokens), server)
    release_pb2_grpc.add_ReleaseServiceServicer_to_server(
        releases.ReleaseServicer(dispatcher), server
    )
    release_pb2_grpc.add_CanaryServiceServicer_to_server(
        CanaryServicer(p.canary, dispatcher), server
    )
    stream_pb2_grpc.add_StreamServiceServicer_to_server(
        StreamServicer(pool, cfg.database_url), server
    )
    return services


def _background_loops(p: _Parts) -> list[asyncio.Task[None]]:
    """The replica's loops: claims, approval expiry, the outbox relay, the max-age sweep,
    the unknown-outcome questions' policy, retention, fast-path recovery, the delta relay and the release self-check."""
    cfg, pool, poke = p.config, p.pool, p.dispatcher.poke
    checks = [p.self_check.run_forever()] if p.self_check is not None else []
    return [
        *(asyncio.create_task(check, name="release-self-check") for check in checks),
        asyncio.create_task(p.dispatcher.run(), name="dispatcher"),
        asyncio.create_task(
            expiry.run_forever(pool, cfg.approval_poll_seconds, poke), name="approval-expiry"
        ),
        asyncio.create_task(
            relay.run_forever(
                pool, RelayConfig(cfg.notify_url, cfg.public_url, envelope=p.envelope)
            ),
            name="outbox-relay",
        ),
        asyncio.create_task(
            max_age.run_forever(pool, cfg.approval_poll_seconds, poke), name="max-age-sweep"
        ),
        asyncio.create_task(
            unknown_outcome.run_forever(pool, cfg.approval_poll_seconds), name="unknown-questions"
        ),
        asyncio.create_task(
            wait_limits.run_forever(pool, WAIT_LIMIT_POLL_SECONDS, poke), name="wait-limits"
        ),
        asyncio.create_task(
            lifecycle.run_forever(pool, cfg.approval_poll_seconds), name="run-lifecycle-webhooks"
        ),
        # Alert rules: a breach fires once through its channel (channels/alerts.py).
        asyncio.create_task(alerts.run_forever(pool, cfg.alert_poll_seconds), name="alert-rules"),
        asyncio.create_task(Retention(pool).run(), name="retention"),
        asyncio.create_task(
            fast_path.recover_forever(pool, poke, cfg.fast_path_heartbeat_seconds),
            name="fast-path-recovery",
        ),
        # Fast-path deltas to and from the other replicas' watchers (LISTEN/NOTIFY).
        asyncio.create_task(
            p.dispatcher.deltas.relay.run_forever(cfg.database_url), name="delta-relay"
        ),
        # And kept for the runs' Durable Streams (docs/streams.md).
        asyncio.create_task(_keep_deltas(p.dispatcher.deltas, pool), name="delta-store"),
    ]


async def _keep_deltas(hub: DeltaHub, pool: Pool) -> None:
    hub.store = DeltaStore(pool)
    await asyncio.gather(hub.store.run_forever(), delta_store.sweep_forever(pool))


def _connections(
    config: ServerConfig, pool: Pool, envelope: Envelope
) -> tuple[OAuthClient, ConnectionTokens]:
    """The OAuth client of connected accounts and the tokens it refreshes."""
    oauth = OAuthClient(
        OAuthSettings(
            config.oauth_url or config.notify_url,
            config.oauth_client_id,
            config.oauth_client_secret,
        )
    )
    return oauth, ConnectionTokens(pool, envelope, oauth)


def _grpc_options(config: ServerConfig, receive_bytes: int | None = None) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", receive_bytes or config.max_message_bytes),
        ("grpc.max_send_message_length", 64 * 1024 * 1024),
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


def _executor_server(
    config: ServerConfig, interceptors: list[grpc.aio.ServerInterceptor]
) -> grpc.aio.Server | None:
    """ExecutorService's own server when it listens apart from the public API, else None."""
    if not config.executor_listen:
        return None
    return grpc.aio.server(
        interceptors=interceptors, options=_grpc_options(config, config.executor_receive_bytes)
    )


# A health servicer and the services it reports on (the readiness watch sets them).
_Health = tuple[health.aio.HealthServicer, tuple[str, ...]]


async def _listen(
    config: ServerConfig,
    server: grpc.aio.Server,
    executors: grpc.aio.Server,
    healths: list[_Health],
) -> tuple[int, int]:
    """Start the public server and, when it has its own, the executor one: their ports."""
    public = server_credentials(config, executor=False)
    if executors is server or not config.executor_listen:
        port = await _serve(server, config.listen, public, healths=healths)
        return port, port
    own = server_credentials(config, executor=True)
    executor_port = await _serve(
        executors, config.executor_listen, own, (EXECUTOR_SERVICE,), healths
    )
    port = await _serve(server, config.listen, public, PUBLIC_SERVICE_NAMES, healths)
    return port, executor_port


async def _serve(
    server: grpc.aio.Server,
    listen: str,
    credentials: grpc.ServerCredentials | None,
    services: tuple[str, ...] = SERVICE_NAMES,
    healths: list[_Health] | None = None,
) -> int:
    """Add health and reflection for `services`, bind `listen`, start; returns the port."""
    health_servicer = health.aio.HealthServicer()
    if healths is not None:
        healths.append((health_servicer, services))
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*services, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    port = add_port(server, listen, credentials)
    await server.start()
    for name in ("", *services):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return port


async def _start_triggers(
    pool: Pool,
    config: ServerConfig,
    dispatcher: Dispatcher,
    envelope: Envelope,
    resolver: Resolver,
    flows: ConnectionFlows | None = None,
    readiness: Readiness | None = None,
    services: Services | None = None,
) -> tuple[HttpIngress, list[asyncio.Task[None]]]:
    """The HTTP ingress, the scheduler and the push fetcher of this replica."""
    scheduler = Scheduler(
        pool,
        config.defaults,
        dispatcher.poke,
        poll_seconds=config.scheduler_poll_seconds,
        catchup_seconds=config.schedule_catchup_seconds,
        on_cancel=dispatcher.cancel,
    )
    fetcher = PushFetcher(
        pool,
        config.defaults,
        dispatcher.poke,
        poll_seconds=config.push_poll_seconds,
        tokens=flows.tokens if flows is not None else None,
    )
    ctx = HttpContext(
        pool,
        config,
        envelope,
        on_runnable=dispatcher.poke,
        on_fetch_queued=fetcher.poke,
        resolver=resolver,
        verifier=resolver.verifier,
        connections=flows,
        readiness=readiness,
        fast_path=FastPath(dispatcher),
        services=services,
    )
    http = HttpIngress(build_app(ctx), config.http_listen, tls=http_files(config))
    await http.start()
    return http, [
        asyncio.create_task(scheduler.run(), name="scheduler"),
        asyncio.create_task(fetcher.run(), name="push-fetcher"),
    ]


def write_port_file(path: str, port: int) -> None:
    """`port` in the file at `path`, whole or not at all (written beside it, then renamed)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.replace(tmp, path)


async def serve(config: ServerConfig) -> None:
    """Serve until SIGTERM or SIGINT, then stop gracefully."""
    running = await start(config)
    log.info("control plane serving on %s (port %d)", config.listen, running.port)
    if config.release_gate:
        log.info(
            "release gate on: a release takes new runs only once its canary passed (each "
            "executor's connect runs one while it has not)"
        )
    else:
        log.warning(
            "release gate OFF (AGENTRUN_RELEASE_GATE=off): releases take new runs as soon as "
            "their executors connect, with no canary"
        )
    log.info("HTTP ingress on port %d", running.http_port)
    if running.executor_server is not None:
        log.info("executor service on %s (port %d)", config.executor_listen, running.executor_port)
    # The HTTP port file first: whoever waits for the gRPC one may then read both.
    if config.http_port_file:
        write_port_file(config.http_port_file, running.http_port)
    if config.executor_port_file:
        write_port_file(config.executor_port_file, running.executor_port)
    if config.port_file:
        write_port_file(config.port_file, running.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("control plane stopping")
    await running.stop()


def main() -> None:
    logs.configure()
    tracing.configure("agentrun-control-plane")
    event_loop.run_server(serve(ServerConfig.from_env()))
