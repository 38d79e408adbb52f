"""Fixtures: real PostgreSQL and Redis, a database per test, and the project's processes.

Session scope: `pg`, `template_db`, `spare_databases`, `redis_server`, `sandbox_model`,
`sandbox_providers`, `sandbox_idp`.
Per test: `db_url` / `db` / `pool` (a fresh copy of the migrated template, copied while the test before
ran), `embedded_pg` (the session server to kill and restart), `control_plane` and
`executor_factory` (process factories whose processes are killed at teardown and whose log
tails join the report of a failed test).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable, Iterator

import asyncpg
import pytest

from agentrun_cli.devstack import EmbeddedPostgres, EmbeddedRedis
from control_plane.dispatch import commits
from control_plane.ground.config import ServerConfig
from control_plane.server import RunningServer
from control_plane.server import start as start_server
from tests.harness import secrets_seen
from tests.harness.auth import executor_key
from tests.harness.databases import (
    TEMPLATE_DB,
    SpareDatabases,
    create_template,
    drop_database,
)
from tests.harness.processes import (
    ControlPlane,
    ManagedProcess,
    ProcessGroup,
    SandboxServer,
    start_control_plane,
    start_executor,
    start_sandbox,
)
from tests.harness.servers import (
    EXTERNAL_REASON,
    ExternalPostgres,
    ExternalRedis,
    session_postgres,
    session_redis,
)

_PROCESSES = pytest.StashKey[ProcessGroup]()


# --- PostgreSQL -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pg() -> Iterator[EmbeddedPostgres | ExternalPostgres]:
    """The session's PostgreSQL server (embedded and fast, or DATABASE_URL's)."""
    with session_postgres() as server:
        yield server


@pytest.fixture(autouse=True)
def _plain_postgres_only(request: pytest.FixtureRequest) -> None:
    """Skip a test marked `plain_postgres("why")` when the session's server is a Citus
    coordinator (DATABASE_URL naming one): the one place that says which tests need a
    single PostgreSQL, each with its reason. Unmarked tests never start `pg` here."""
    marker = request.node.get_closest_marker("plain_postgres")
    if marker is None:
        return
    pg = request.getfixturevalue("pg")
    if getattr(pg, "workers", ()):
        why = marker.args[0] if marker.args else "it needs a single PostgreSQL"
        pytest.skip(f"not on a Citus cluster: {why}")


@pytest.fixture
def embedded_pg(pg: EmbeddedPostgres | ExternalPostgres) -> Iterator[EmbeddedPostgres]:
    """The session server, for tests that kill or restart it (running again at teardown)."""
    if not isinstance(pg, EmbeddedPostgres):
        pytest.skip(EXTERNAL_REASON.format(var="DATABASE_URL"))
    yield pg
    pg.start()


@pytest.fixture(scope="session")
async def template_db(pg: EmbeddedPostgres | ExternalPostgres) -> AsyncIterator[str]:
    """The name of a database migrated once per session, copied by every `db_url`."""
    workers = getattr(pg, "workers", ())
    await create_template(pg.url, pg.url_for(TEMPLATE_DB), workers)
    yield TEMPLATE_DB
    _ensure_running(pg)
    await drop_database(pg.url, TEMPLATE_DB, workers)


@pytest.fixture(scope="session")
def spare_databases(
    pg: EmbeddedPostgres | ExternalPostgres, template_db: str
) -> Iterator[SpareDatabases]:
    """Copies of the template made one test ahead, while the test before runs."""
    spares = SpareDatabases(pg.url, template_db, getattr(pg, "workers", ()))
    yield spares
    _ensure_running(pg)
    spares.close()


@pytest.fixture
async def db_url(
    pg: EmbeddedPostgres | ExternalPostgres, spare_databases: SpareDatabases
) -> AsyncIterator[str]:
    """The DSN of a fresh, migrated database of this test's own (dropped afterwards)."""
    name = await spare_databases.take()
    yield pg.url_for(name)
    _ensure_running(pg)  # a test may have killed the server and left it down
    spare_databases.drop(name)


@pytest.fixture
async def server(db_url: str) -> AsyncIterator[RunningServer]:
    """A control plane in this test's event loop (gRPC on a free port, HTTP ingress too)."""
    running = await start_server(ServerConfig(database_url=db_url, listen="127.0.0.1:0"))
    yield running
    await running.stop(grace=0)


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[asyncpg.Pool]:
    """An asyncpg pool on this test's database (a test needing more connections at once
    defines its own)."""
    p = await asyncpg.create_pool(db_url, min_size=1, max_size=8)
    yield p
    await commits.close_for(p)  # the connections a test's commit groups hold (lanes)
    await p.close()


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[asyncpg.Connection]:
    """An asyncpg connection to this test's database."""
    conn = await asyncpg.connect(db_url)
    yield conn
    # The test may have killed the server under it: a connection that cannot say goodbye.
    with contextlib.suppress(OSError, asyncpg.InterfaceError):
        await conn.close()


def _ensure_running(pg: EmbeddedPostgres | ExternalPostgres) -> None:
    if isinstance(pg, EmbeddedPostgres):
        pg.start()


# --- Redis ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis | ExternalRedis]:
    """The session's Redis server (embedded, or REDIS_URL's); `.url` is its URL."""
    with session_redis() as server:
        yield server


@pytest.fixture
def embedded_redis(redis_server: EmbeddedRedis | ExternalRedis) -> Iterator[EmbeddedRedis]:
    """The session Redis, for tests that kill or restart it (running again at teardown)."""
    if not isinstance(redis_server, EmbeddedRedis):
        pytest.skip(EXTERNAL_REASON.format(var="REDIS_URL"))
    yield redis_server
    redis_server.start()


# --- processes --------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def session_processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessGroup]:
    """Processes that live for the whole session (the sandboxes)."""
    group = ProcessGroup(tmp_path_factory.mktemp("session-logs"))
    yield group
    group.kill_all()


@pytest.fixture(scope="session")
def sandbox_model(session_processes: ProcessGroup) -> SandboxServer:
    """The local model server; executors reach it at `<url>/v1`."""
    return start_sandbox(session_processes, "model")


@pytest.fixture(scope="session")
def sandbox_providers(session_processes: ProcessGroup) -> SandboxServer:
    """The local tool providers' server."""
    return start_sandbox(session_processes, "providers")


@pytest.fixture(scope="session")
def sandbox_idp(session_processes: ProcessGroup) -> SandboxServer:
    """The local OpenID Connect provider; its issuer is its URL (`http://127.0.0.1:<port>`)."""
    return start_sandbox(session_processes, "idp")


@pytest.fixture
def processes(request: pytest.FixtureRequest, tmp_path) -> Iterator[ProcessGroup]:
    """This test's processes: killed at teardown, their log tails reported if it fails."""
    group = ProcessGroup(tmp_path / "logs")
    request.node.stash[_PROCESSES] = group
    yield group
    group.kill_all()


@pytest.fixture
def control_plane(
    processes: ProcessGroup, sandbox_providers: SandboxServer
) -> Callable[..., ControlPlane]:
    """Factory: `control_plane(db_url, **env) -> ControlPlane` (a replica, ready to serve).

    Its approval notifications go to the sandbox mail and chat providers.
    """

    def start(database_url: str, **env: object) -> ControlPlane:
        settings = {"AGENTRUN_NOTIFY_URL": sandbox_providers.url, **env}
        return start_control_plane(processes, database_url, **settings)

    return start


@pytest.fixture
def executor_factory(
    processes: ProcessGroup,
    sandbox_model: SandboxServer,
    sandbox_providers: SandboxServer,
    redis_server: EmbeddedRedis | ExternalRedis,
) -> Callable[..., list[ManagedProcess]]:
    """Factory: `executor_factory(control_plane, count=1, **env) -> [executor process, …]`.

    `control_plane` is a ControlPlane or a "host:port" address. Executors are named
    executor-1, executor-2, … (their AGENTRUN_EXECUTOR_ID) in the order this test starts them.
    Unless env gives AGENTRUN_EXECUTOR_KEY, they get an all-workspaces executor credential
    minted in the ControlPlane's database (a bare address needs the key in env).
    """
    serial = itertools.count(1)
    minted: dict[str, str] = {}

    def credential(control_plane: ControlPlane | str) -> dict[str, str]:
        if not isinstance(control_plane, ControlPlane) or not control_plane.database_url:
            return {}
        url = control_plane.database_url
        if url not in minted:
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                minted[url] = pool.submit(asyncio.run, executor_key(url)).result()
        return {"AGENTRUN_EXECUTOR_KEY": minted[url]}

    sandboxes = {
        "AGENTRUN_MODEL_BASE_URL": f"{sandbox_model.url}/v1",
        "AGENTRUN_PROVIDERS_URL": sandbox_providers.url,
        "REDIS_URL": redis_server.url,
    }

    def start(
        control_plane: ControlPlane | str, count: int = 1, **env: object
    ) -> list[ManagedProcess]:
        address = (
            control_plane.address if isinstance(control_plane, ControlPlane) else control_plane
        )
        settings = {**sandboxes, **env}
        if "AGENTRUN_EXECUTOR_KEY" not in env:
            settings.update(credential(control_plane))
        return [
            start_executor(processes, address, f"executor-{next(serial)}", **settings)
            for _ in range(count)
        ]

    return start


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if any process log holds a credential the harness handed out."""
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None or secrets_seen.count() == 0:
        return
    leaked = secrets_seen.leaks(factory.getbasetemp())
    if leaked:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line("credentials found in process logs:", red=True)
            for line in leaked:
                reporter.write_line(f"  {line}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """Attach the log tails of the test's processes to the report when the test fails."""
    report = yield
    group = item.stash.get(_PROCESSES, None)
    if report.failed and report.when in ("setup", "call") and group and group.processes:
        report.sections.append(("process logs", group.log_tails()))
    return report
