"""Transport security against real servers and real handshakes: TLS on every listener,
ExecutorService on its own listener, client certificates on it, and the executor
identity a verified certificate carries.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import replace

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from agentrun.v1 import agent_pb2, agent_pb2_grpc, run_pb2
from agentrun_cli.credentials import open_channel as cli_channel
from control_plane.auth.mtls import executor_from_peer
from control_plane.auth.principal import Kind
from control_plane.ground.config import ServerConfig
from control_plane.server import RunningServer, start
from executor.transport import ChannelSecurity, open_channel
from tests.harness.agentrun_api import Api
from tests.harness.auth import executor_key, workspace_key
from tests.harness.connect_probe import connect_code
from tests.harness.tls import Pem, Pki

HOST = "127.0.0.1"
EXECUTOR_SERVICE = "agentrun.v1.ExecutorService"
AGENT_SERVICE = "agentrun.v1.AgentService"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki.create(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def foreign(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """Another CA: its certificates are trusted by nobody here."""
    return Pki.create(tmp_path_factory.mktemp("foreign-pki"), "someone else's CA")


def tls_config(db_url: str, pki: Pki, **settings: object) -> ServerConfig:
    files = {"tls_cert": str(pki.server.cert), "tls_key": str(pki.server.key)}
    return replace(ServerConfig(database_url=db_url, listen=f"{HOST}:0"), **{**files, **settings})


def credentials(pki: Pki, client: Pem | None = None) -> grpc.ChannelCredentials:
    key, cert = client.read() if client else (None, None)
    return grpc.ssl_channel_credentials(pki.ca.read_bytes(), key, cert)


async def health(channel: grpc.aio.Channel, service: str = "") -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return reply.status


async def health_code(channel: grpc.aio.Channel, service: str = "") -> grpc.StatusCode:
    """OK when the port serves `service`, else the status the call failed with."""
    try:
        await health(channel, service)
    except grpc.aio.AioRpcError as err:
        return err.code()
    return grpc.StatusCode.OK


async def listed_services(channel: grpc.aio.Channel) -> set[str]:
    """What the port's reflection service says it serves (a real bidi RPC)."""
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)

    async def one() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
        yield reflection_pb2.ServerReflectionRequest(list_services="")

    async for reply in stub.ServerReflectionInfo(one(), timeout=5):
        return {s.name for s in reply.list_services_response.service}
    raise AssertionError("no reflection reply")


@pytest.fixture
async def running() -> AsyncIterator[list[RunningServer]]:
    """Servers a test starts: stopped at teardown."""
    servers: list[RunningServer] = []
    yield servers
    for server in servers:
        await server.stop(grace=0)


# --- TLS on the public listeners ---------------------------------------------------------------


async def test_grpc_serves_tls_only(db_url, pki, foreign, running):
    server = await start(tls_config(db_url, pki))
    running.append(server)
    address = f"{HOST}:{server.port}"

    async with grpc.aio.secure_channel(address, credentials(pki)) as channel:
        assert await health(channel) == health_pb2.HealthCheckResponse.SERVING
        assert {AGENT_SERVICE, EXECUTOR_SERVICE} <= await listed_services(channel)
    async with grpc.aio.insecure_channel(address) as plaintext:
        assert await health_code(plaintext) == grpc.StatusCode.UNAVAILABLE
    # A client that does not trust our CA refuses the server: the certificate is what's checked.
    untrusting = grpc.ssl_channel_credentials(foreign.ca.read_bytes())
    async with grpc.aio.secure_channel(address, untrusting) as channel:
        assert await health_code(channel) == grpc.StatusCode.UNAVAILABLE


async def test_http_serves_tls_only(db_url, pki, running):
    server = await start(tls_config(db_url, pki))
    running.append(server)

    trust = ssl.create_default_context(cafile=str(pki.ca))
    async with httpx.AsyncClient(verify=trust, timeout=5) as client:
        reply = await client.get(f"https://{HOST}:{server.http_port}/healthz")
        assert reply.status_code == 200
    async with httpx.AsyncClient(timeout=5) as client:
        with pytest.raises(httpx.TransportError):
            await client.get(f"http://{HOST}:{server.http_port}/healthz")


@pytest.mark.parametrize(
    ("settings", "complaint"),
    [
        ({"tls_key": None}, "AGENTRUN_TLS_CERT and AGENTRUN_TLS_KEY"),
        ({"tls_client_ca": "ca.pem"}, "AGENTRUN_TLS_CLIENT_CA needs AGENTRUN_EXECUTOR_LISTEN"),
        ({"tls_key": "/nonexistent/server.key"}, "AGENTRUN_TLS_KEY: cannot read"),
    ],
)
async def test_settings_that_would_weaken_tls_are_refused(db_url, pki, settings, complaint):
    with pytest.raises(SystemExit, match=complaint):
        running = await start(tls_config(db_url, pki, **settings))
        await running.stop(grace=0)


# --- The executor listener ----------------------------------------------------------------------


async def test_executor_service_is_served_on_its_own_listener_only(db_url, running):
    config = ServerConfig(database_url=db_url, listen=f"{HOST}:0", executor_listen=f"{HOST}:0")
    server = await start(config)
    running.append(server)
    assert server.executor_port not in (0, server.port)

    key = await executor_key(db_url)
    async with grpc.aio.insecure_channel(f"{HOST}:{server.executor_port}") as channel:
        assert await connect_code(channel) == grpc.StatusCode.UNAUTHENTICATED
        assert await connect_code(channel, key) == grpc.StatusCode.OK
        assert await health(channel, EXECUTOR_SERVICE) == health_pb2.HealthCheckResponse.SERVING
        assert await listed_services(channel) == {
            EXECUTOR_SERVICE,
            "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection",
        }
        agents = agent_pb2_grpc.AgentServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await agents.GetAgent(agent_pb2.GetAgentRequest(workspace_id="ws", agent_id="a"))
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED

    async with grpc.aio.insecure_channel(f"{HOST}:{server.port}") as channel:
        assert await connect_code(channel) == grpc.StatusCode.UNIMPLEMENTED
        assert await health_code(channel, EXECUTOR_SERVICE) == grpc.StatusCode.NOT_FOUND
        assert await health(channel, AGENT_SERVICE) == health_pb2.HealthCheckResponse.SERVING
        assert EXECUTOR_SERVICE not in await listed_services(channel)


async def test_without_its_own_listener_executors_connect_to_the_public_one(db_url, running):
    server = await start(ServerConfig(database_url=db_url, listen=f"{HOST}:0"))
    running.append(server)
    assert server.executor_port == server.port
    async with grpc.aio.insecure_channel(f"{HOST}:{server.port}") as channel:
        assert await connect_code(channel, await executor_key(db_url)) == grpc.StatusCode.OK


async def test_the_executor_listener_requires_a_certificate_from_the_client_ca(
    db_url, pki, foreign, running
):
    config = tls_config(db_url, pki, executor_listen=f"{HOST}:0", tls_client_ca=str(pki.ca))
    server = await start(config)
    running.append(server)
    executors = f"{HOST}:{server.executor_port}"
    executor_cert = pki.client("exec-1", executor_pool="pool-a")

    async with grpc.aio.secure_channel(executors, credentials(pki, executor_cert)) as channel:
        assert await connect_code(channel) == grpc.StatusCode.OK
    async with grpc.aio.secure_channel(executors, credentials(pki)) as channel:
        assert await health_code(channel) == grpc.StatusCode.UNAVAILABLE  # no certificate
    stranger = credentials(pki, foreign.client("mallory", executor_pool="pool-a"))
    async with grpc.aio.secure_channel(executors, stranger) as channel:
        assert await health_code(channel) == grpc.StatusCode.UNAVAILABLE  # not our CA's
    # The public API asks for no certificate: key-holding clients have none.
    async with grpc.aio.secure_channel(f"{HOST}:{server.port}", credentials(pki)) as channel:
        assert await health(channel) == health_pb2.HealthCheckResponse.SERVING


# --- Executor identity from a verified certificate ---------------------------------------------


async def _echo_auth_context(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    peer = context.auth_context()
    return json.dumps({k: [v.decode("latin-1") for v in vs] for k, vs in peer.items()}).encode()


@pytest.fixture
async def peer_server(pki: Pki) -> AsyncIterator[dict[str, int]]:
    """A tiny server answering with its `context.auth_context()`: on a port that requires
    client certificates ("mtls"), one that asks for none ("tls"), a plaintext one."""
    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(_echo_auth_context)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("test.Peer", {"AuthContext": handler}),)
    )
    pair = [pki.server.read()]
    mtls = grpc.ssl_server_credentials(pair, pki.ca.read_bytes(), require_client_auth=True)
    ports = {
        "mtls": server.add_secure_port(f"{HOST}:0", mtls),
        "tls": server.add_secure_port(f"{HOST}:0", grpc.ssl_server_credentials(pair)),
        "plaintext": server.add_insecure_port(f"{HOST}:0"),
    }
    await server.start()
    yield ports
    await server.stop(0)


async def peer_of(port: int, creds: grpc.ChannelCredentials | None) -> dict[str, list[bytes]]:
    """What the server's `context.auth_context()` held for this connection."""
    address = f"{HOST}:{port}"
    async with (
        grpc.aio.secure_channel(address, creds) if creds else grpc.aio.insecure_channel(address)
    ) as channel:
        reply = await channel.unary_unary("/test.Peer/AuthContext")(b"", timeout=5)
    return {k: [v.encode("latin-1") for v in vs] for k, vs in json.loads(reply).items()}


def fingerprint(pem: Pem) -> str:
    der = ssl.PEM_cert_to_DER_cert(pem.cert.read_text())
    return hashlib.sha256(der).hexdigest()[:16]


async def test_an_executor_certificate_is_an_executor_of_every_workspace(pki, peer_server):
    cert = pki.client("exec-eu-1", executor_pool="eu")
    who = executor_from_peer(await peer_of(peer_server["mtls"], credentials(pki, cert)))
    assert who is not None
    assert (who.kind, who.name, who.scope) == (Kind.EXECUTOR, "exec-eu-1", None)
    assert who.credential_id == f"cert:{fingerprint(cert)}"
    assert who.serves("any-workspace")
    assert who.workspace_id is None and not who.capabilities


async def test_workspace_uris_scope_an_executor_certificate(pki, peer_server):
    cert = pki.client("exec-dedicated", executor_pool="acme", workspaces=["acme-prod", "acme-dev"])
    who = executor_from_peer(await peer_of(peer_server["mtls"], credentials(pki, cert)))
    assert who is not None
    assert who.scope == frozenset({"acme-prod", "acme-dev"})
    assert who.serves("acme-prod") and not who.serves("globex")


@pytest.mark.parametrize(
    ("name", "pool", "uris"),
    [
        ("alice", None, []),  # an ordinary client certificate of the same CA
        ("odd", None, ["agentrun://workspace/acme"]),  # a scope but no executor marker
        ("two-pools", "a", ["agentrun://executor/b"]),
        ("empty-pool", None, ["agentrun://executor/"]),
        ("bad-scope", "a", ["agentrun://workspace/acme/extra"]),  # must not widen to all
        ("empty-scope", "a", ["agentrun://workspace/"]),
    ],
)
async def test_other_certificates_are_not_executors(pki, peer_server, name, pool, uris):
    cert = pki.client(name, executor_pool=pool, uris=uris)
    peer = await peer_of(peer_server["mtls"], credentials(pki, cert))
    assert peer["x509_common_name"] == [name.encode()]  # verified, and still refused
    assert executor_from_peer(peer) is None


async def test_no_executor_without_a_verified_certificate(pki, peer_server):
    cert = pki.client("exec-1", executor_pool="pool-a")
    # A port that does not ask for certificates never sees the one the client holds.
    assert executor_from_peer(await peer_of(peer_server["tls"], credentials(pki, cert))) is None
    assert executor_from_peer(await peer_of(peer_server["plaintext"], None)) is None


# --- Clients: the executor's channel and the CLI's ----------------------------------------------


async def test_the_executor_channel_verifies_the_name_it_is_told(db_url, pki, running):
    internal = pki.server_cert("cp.internal")
    server = await start(
        tls_config(db_url, pki, tls_cert=str(internal.cert), tls_key=str(internal.key))
    )
    running.append(server)
    address = f"{HOST}:{server.port}"

    for name, expected in (
        (None, grpc.StatusCode.UNAVAILABLE),
        ("cp.internal", grpc.StatusCode.OK),
    ):
        security = ChannelSecurity(ca=str(pki.ca), server_name=name)
        async with open_channel(address, security.options(), security.credentials()) as channel:
            assert await health_code(channel) == expected, name


def test_executor_tls_settings_come_in_pairs():
    with pytest.raises(ValueError, match="AGENTRUN_TLS_CLIENT_KEY"):
        ChannelSecurity.from_env({"AGENTRUN_TLS_CLIENT_CERT": "exec.pem"})
    assert not ChannelSecurity.from_env({}).enabled


async def test_the_cli_speaks_tls_when_given_the_ca(db_url, pki, running, monkeypatch):
    server = await start(tls_config(db_url, pki))
    running.append(server)
    monkeypatch.setenv("AGENTRUN_TLS_CA", str(pki.ca))

    def check() -> int:  # the CLI is synchronous: off this loop, which serves the server
        with cli_channel(f"{HOST}:{server.port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            return stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status

    assert await asyncio.to_thread(check) == health_pb2.HealthCheckResponse.SERVING


# --- End to end: an executor process whose only credential is its certificate ----------------
#
# Connect is authenticated: with no bearer key, the interceptor admits the stream only on a
# verified executor certificate (executor_from_peer), scoped by the certificate's SANs.


async def test_an_executor_with_only_a_client_certificate_runs_a_run(
    db_url, pki, running, executor_factory
):
    config = tls_config(db_url, pki, executor_listen=f"{HOST}:0", tls_client_ca=str(pki.ca))
    server = await start(config)
    running.append(server)
    key = await workspace_key(db_url, "tls-ws", role="admin")
    api = Api(f"{HOST}:{server.port}", workspace="tls-ws", key=key, tls=credentials(pki))
    try:
        await api.publish("echoer", "echo_input", ["echo"])
        run_id = await api.start("echoer", "hello over TLS")
        cert = pki.client("exec-tls", executor_pool="tls", workspaces=["tls-ws"])
        executor_factory(
            f"{HOST}:{server.executor_port}",
            AGENTRUN_TLS_CA=pki.ca,
            AGENTRUN_TLS_CLIENT_CERT=cert.cert,
            AGENTRUN_TLS_CLIENT_KEY=cert.key,
            AGENTRUN_EXECUTOR_KEY="",
        )
        (run,) = await api.wait_terminal([run_id], within=30)
        assert run.status == run_pb2.RUN_STATUS_COMPLETED, run.error
    finally:
        await api.close()


async def test_the_control_plane_process_reads_its_transport_from_the_environment(
    db_url, pki, control_plane, tmp_path
):
    port_file = tmp_path / "executor.port"
    cp = control_plane(
        db_url,
        AGENTRUN_TLS_CERT=pki.server.cert,
        AGENTRUN_TLS_KEY=pki.server.key,
        AGENTRUN_TLS_CLIENT_CA=pki.ca,
        AGENTRUN_EXECUTOR_LISTEN=f"{HOST}:0",
        AGENTRUN_EXECUTOR_PORT_FILE=port_file,
    )
    executors = f"{HOST}:{int(port_file.read_text())}"
    cert = credentials(pki, pki.client("exec-1", executor_pool="pool-a"))
    async with grpc.aio.secure_channel(executors, cert) as channel:
        assert await connect_code(channel) == grpc.StatusCode.OK
    async with grpc.aio.secure_channel(cp.address, credentials(pki)) as channel:
        assert await connect_code(channel) == grpc.StatusCode.UNIMPLEMENTED
    async with grpc.aio.insecure_channel(cp.address) as channel:
        assert await health_code(channel) == grpc.StatusCode.UNAVAILABLE
