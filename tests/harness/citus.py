"""A Citus cluster for tests: fresh databases on every node, and a planner probe.

The cluster is not ours to start: AGENTRUN_TEST_CITUS_URL names a database on its
coordinator (with the citus extension and the workers added). `fresh_database` makes a
new database on the coordinator and on every worker the coordinator knows, adds the
workers to it, and returns its DSN; `probe` asks the coordinator's planner about every
named statement. When DATABASE_URL names such a coordinator instead, the whole suite runs
there (tests/harness/databases.py uses `create_cluster_database` for its template).
"""

from __future__ import annotations

import datetime
import os
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from control_plane.store.queries import QUERIES, Query
from tests import factories
from tests.harness.databases import new_database_name
from tests.harness.servers import dsn_with_database

CITUS_URL_VAR = "AGENTRUN_TEST_CITUS_URL"
SKIP_REASON = (
    f"{CITUS_URL_VAR} is not set: these tests need a Citus coordinator "
    "(a DSN to a database with the citus extension and its workers added)"
)

# Shards per distributed table in the suite's databases (two a worker on two workers):
# enough to route, few enough to copy a database per test quickly.
TEST_SHARD_COUNT = 4

# The statements whose path every run takes, by what they do. Each should be on one shard.
HOT = {
    "run_claim": "claim",
    "run_commit": "commit",
    "run_commit_keep": "commit",
    "run_commit_many": "commit",
    "run_heartbeat": "heartbeat",
    "run_insert": "admission",
    "run_insert_latest": "admission",
    "approval_lock": "approval decision",
    "approval_run_lock": "approval decision",
    "approval_decide": "approval decision",
    "approval_decision_step": "approval decision",
}


def citus_url() -> str | None:
    return os.environ.get(CITUS_URL_VAR) or None


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "localhost", parts.port or 5432


async def _execute(url: str, *statements: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        for sql in statements:
            await conn.execute(sql)
    finally:
        await conn.close()


async def worker_urls(url: str) -> tuple[str, ...]:
    """A DSN to each worker of the coordinator whose database `url` names (to its
    `postgres` database, as `url`'s user); () when that database has no Citus."""
    conn = await asyncpg.connect(url)
    try:
        if not await conn.fetchval("SELECT 1 FROM pg_extension WHERE extname = 'citus'"):
            return ()
        rows = await conn.fetch(
            "SELECT nodename, nodeport FROM pg_dist_node WHERE groupid <> 0 AND isactive"
            " ORDER BY nodeid"
        )
    finally:
        await conn.close()
    parts = urlsplit(url)
    user = f"{parts.username}@" if parts.username else ""
    return tuple(
        urlunsplit(
            parts._replace(netloc=f"{user}{r['nodename']}:{r['nodeport']}", path="/postgres")
        )
        for r in rows
    )


async def create_cluster_database(admin_url: str, workers: Sequence[str], name: str) -> None:
    """A new database `name` with citus on the coordinator (`admin_url`'s server) and on
    every worker, the workers added to it."""
    for url in (*workers, admin_url):
        await _execute(url, f"CREATE DATABASE {_quoted(name)}")
        await _execute(dsn_with_database(url, name), "CREATE EXTENSION citus")
    host, port = _host_port(admin_url)
    adds = [f"SELECT citus_set_coordinator_host('{host}', {port})"]
    adds += ["SELECT citus_add_node('{}', {})".format(*_host_port(w)) for w in workers]
    await _execute(dsn_with_database(admin_url, name), *adds)


async def close_to_connections(admin_url: str, workers: Sequence[str], name: str) -> None:
    """Make `name` copyable on every node: no new connections, the open ones (Citus's
    maintenance daemon and its connections between nodes) ended."""
    for url in (admin_url, *workers):
        await _execute(
            url,
            f"ALTER DATABASE {_quoted(name)} WITH ALLOW_CONNECTIONS false",
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            f" WHERE datname = '{name}' AND pid <> pg_backend_pid()",
        )


async def fresh_database(url: str, prefix: str = "citus") -> str:
    """A new, empty database with citus on the coordinator and every worker; its DSN."""
    name = new_database_name(prefix)
    await create_cluster_database(url, await worker_urls(url), name)
    return dsn_with_database(url, name)


async def drop_database(url: str) -> None:
    """Drop a database made by fresh_database, on the coordinator and every worker."""
    name = urlsplit(url).path.lstrip("/")
    workers = await worker_urls(url)
    for node in (url, *workers):
        await _execute(
            dsn_with_database(node, "postgres"),
            f"DROP DATABASE IF EXISTS {_quoted(name)} WITH (FORCE)",
        )


# --- the planner probe -------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """What the coordinator's planner says about one named statement."""

    name: str
    # The planner's error, or None when it plans (and runs on empty tables) the statement.
    refused: str | None
    # The largest task count of any distributed scan in its plan (0: none, coordinator only).
    tasks: int

    @property
    def multi_shard(self) -> bool:
        return self.tasks > 1


_TASKS = re.compile(r"Task Count: (\d+)")
_NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


async def two_workspaces(conn: asyncpg.Connection) -> tuple[str, str]:
    """Two workspace ids whose shards sit on different workers (or at least differ)."""
    sql = """
        SELECT s.shardid, p.nodeport FROM pg_dist_shard s
        JOIN pg_dist_placement pl USING (shardid) JOIN pg_dist_node p USING (groupid)
        WHERE s.shardid = get_shard_id_for_distribution_column('workspaces', $1::text)
    """
    first = await conn.fetchrow(sql, "ws-a")
    for i in range(200):
        other = await conn.fetchrow(sql, f"ws-b{i}")
        if other["nodeport"] != first["nodeport"]:
            return "ws-a", f"ws-b{i}"
    raise AssertionError("no second worker holds a shard")


@dataclass(frozen=True)
class Samples:
    """The values a statement is probed with: two workspaces on different workers, each
    with an agent of the same name (text parameters name both) and one running run."""

    workspaces: tuple[str, str]
    runs: tuple[uuid.UUID, uuid.UUID]


async def seed(conn: asyncpg.Connection) -> Samples:
    """Rows for the sample values to find, so that a statement also runs on data: some
    refusals come only when a row matches (a function reading a distributed table from a
    shard)."""
    workspaces = await two_workspaces(conn)
    runs = []
    for workspace_id in workspaces:
        run = (await factories.queued_runs(conn, 1, workspace_id, workspace_id))[0]
        await conn.execute(
            "UPDATE runs SET status = 'running', lease_owner = $1, lease_epoch = 1,"
            " held_since = now(), wake_at = now() + interval '1 hour'"
            " WHERE workspace_id = $1 AND run_id = $2",
            workspace_id,
            run.run_id,
        )
        runs.append(run.run_id)
    return Samples(workspaces, (runs[0], runs[1]))


def _value(type_name: str, samples: Samples) -> Any:
    workspaces = samples.workspaces
    scalar: dict[str, Any] = {
        "text": workspaces[0],
        "varchar": workspaces[0],
        "bpchar": workspaces[0],
        "name": workspaces[0],
        "int2": 1,
        "int4": 1,
        "int8": 1,
        "numeric": Decimal(1),
        "float4": 1.0,
        "float8": 1.0,
        "bool": False,
        "timestamptz": _NOW,
        "timestamp": _NOW.replace(tzinfo=None),
        "date": _NOW.date(),
        "interval": datetime.timedelta(seconds=30),
        "jsonb": "{}",
        "json": "{}",
        "bytea": b"x",
        "uuid": samples.runs[0],
    }
    if type_name.startswith("_"):
        element = type_name[1:]
        if element in ("text", "varchar"):
            return list(workspaces)
        if element == "uuid":
            return list(samples.runs)
        if element in ("int4", "int8"):
            return [1, 2]
        return [scalar.get(element)] * 2
    return scalar.get(type_name)


async def probe_one(conn: asyncpg.Connection, query: Query, samples: Samples) -> Verdict:
    """Plan the statement (EXPLAIN with sample values), then run it on empty tables, both in
    a transaction rolled back: the planner's refusals show at either step. A statement with
    a time parameter is probed again with every time NULL, as the server sends it ("the
    database clock unless $n"): Citus refuses `coalesce($n, now())` in a write only then."""
    try:
        statement = await conn.prepare(query.sql)
    except asyncpg.PostgresError as exc:
        return Verdict(query.name, f"prepare: {exc}", 0)
    types = [t.name for t in statement.get_parameters()]
    args = [_value(t, samples) for t in types]
    verdict = await _probe_args(conn, query, args)
    if verdict.refused is None and "timestamptz" in types:
        clock = [None if t == "timestamptz" else a for t, a in zip(types, args, strict=True)]
        no_time = await _probe_args(conn, query, clock)
        if no_time.refused is not None:
            return Verdict(query.name, f"{no_time.refused} (times NULL)", verdict.tasks)
    return verdict


async def _probe_args(conn: asyncpg.Connection, query: Query, args: list[Any]) -> Verdict:
    try:
        plan = await _rolled_back(conn, f"EXPLAIN (COSTS OFF) {query.sql}", args)
    except asyncpg.PostgresError as exc:
        if not _is_refusal(exc):  # a sample value the statement casts (text to xid8, say)
            return Verdict(query.name, None, 0)
        return Verdict(query.name, f"plan: {_one_line(exc)}", 0)
    tasks = max((int(n) for row in plan for n in _TASKS.findall(row[0])), default=0)
    try:
        await _rolled_back(conn, query.sql, args)
    except asyncpg.PostgresError as exc:
        if _is_refusal(exc):
            return Verdict(query.name, f"run: {_one_line(exc)}", tasks)
    return Verdict(query.name, None, tasks)


async def _rolled_back(conn: asyncpg.Connection, sql: str, args: list[Any]) -> list[Any]:
    # Each in a transaction of its own: a failed EXPLAIN of a remote task leaves the
    # worker's side of the transaction aborted.
    transaction = conn.transaction()
    await transaction.start()
    try:
        return await conn.fetch(sql, *args)
    finally:
        await transaction.rollback()


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _is_refusal(exc: asyncpg.PostgresError) -> bool:
    """A refusal by Citus, not the sample values failing a constraint or a check."""
    # Data, integrity, a function's RAISE, serialization: the sample values, not Citus.
    return not (exc.sqlstate or "").startswith(("22", "23", "P0", "40"))


async def probe(conn: asyncpg.Connection) -> dict[str, Verdict]:
    """Every named statement's verdict on the coordinator at `conn` (a database of its
    own: it is seeded with sample rows first)."""
    samples = await seed(conn)
    return {name: await probe_one(conn, q, samples) for name, q in sorted(QUERIES.items())}
