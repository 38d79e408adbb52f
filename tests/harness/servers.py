"""The session's PostgreSQL and Redis: embedded servers, or the ones named by the environment."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from agentrun_cli.devstack import EmbeddedPostgres, EmbeddedRedis

EXTERNAL_REASON = (
    "{var} points at a server the test harness does not own; "
    "this test kills or restarts the server, which it only does to its own embedded one"
)


def dsn_with_database(url: str, dbname: str) -> str:
    """`url` with its database name replaced by `dbname`."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{dbname}"))


class ExternalPostgres:
    """A PostgreSQL server named by DATABASE_URL: databases come and go, the server stays.

    When DATABASE_URL names a database of a Citus coordinator (the extension installed and
    workers added), `workers` holds a DSN to each worker, and every test database is made
    on all of them and distributed (tests/harness/databases.py).
    """

    def __init__(self, url: str, workers: tuple[str, ...] = ()) -> None:
        self.url = url
        self.workers = workers

    def __repr__(self) -> str:
        return f"ExternalPostgres({urlsplit(self.url).hostname}:{urlsplit(self.url).port})"

    def url_for(self, dbname: str) -> str:
        return dsn_with_database(self.url, dbname)


class ExternalRedis:
    """A Redis server named by REDIS_URL."""

    def __init__(self, url: str) -> None:
        self.url = url

    def __repr__(self) -> str:
        return f"ExternalRedis({urlsplit(self.url).hostname}:{urlsplit(self.url).port})"


@contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A temporary directory for a server's data, removed afterwards."""
    # Not pytest's tmp_path: every pytest session resets its base directory to mode 0700,
    # which would lock PostgreSQL (running as another user when we are root) out of its data.
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def session_postgres() -> Iterator[EmbeddedPostgres | ExternalPostgres]:
    """DATABASE_URL's server, or a fast (no fsync) embedded one for the duration."""
    if url := os.environ.get("DATABASE_URL"):
        from tests.harness.citus import worker_urls

        yield ExternalPostgres(url, asyncio.run(worker_urls(url)))
        return
    with scratch_dir("agentrun-test-pg-") as root:
        server = EmbeddedPostgres(root / "data", fast=True)
        with server:
            yield server


@contextmanager
def session_redis() -> Iterator[EmbeddedRedis | ExternalRedis]:
    """REDIS_URL's server, or an embedded one for the duration."""
    if url := os.environ.get("REDIS_URL"):
        yield ExternalRedis(url)
        return
    with scratch_dir("agentrun-test-redis-") as root, EmbeddedRedis(root / "data") as server:
        yield server
