"""The embedded servers: start, serve, crash, come back on the same port with their data."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
import redis.asyncio as aioredis

from agentrun_cli import devstack
from agentrun_cli.devstack import EmbeddedPostgres, EmbeddedRedis, port_accepts_connections
from tests.harness.servers import scratch_dir

_SETTINGS = """
SELECT string_agg(name || '=' || setting, ' ' ORDER BY name) FROM pg_settings
WHERE name IN ('fsync', 'synchronous_commit', 'max_connections', 'listen_addresses')
"""


@pytest.fixture
def data_dir() -> Iterator[Path]:
    with scratch_dir("agentrun-devstack-test-") as path:
        yield path


async def _fetchval(url: str, sql: str) -> object:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


async def _execute(url: str, sql: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def _redis_get(url: str, key: str) -> bytes | None:
    client = aioredis.from_url(url)
    try:
        assert await client.ping()
        return await client.get(key)
    finally:
        await client.aclose()


async def test_postgres_comes_back_after_a_crash_on_the_same_port_with_its_data(
    data_dir: Path,
) -> None:
    with EmbeddedPostgres(data_dir / "pg", fast=True) as server:
        await _execute(server.url, "CREATE TABLE t (x int); INSERT INTO t VALUES (42)")
        port, pid = server.port, server.pid

        server.kill()
        assert not server.running
        assert not port_accepts_connections(port)

        server.restart()
        assert (server.port, server.running) == (port, True)
        assert server.pid != pid
        assert await _fetchval(server.url, "SELECT x FROM t") == 42
        assert "redo" in (data_dir / "pg" / "log").read_text()  # crash recovery ran
        assert await _fetchval(server.url, _SETTINGS) == (
            "fsync=off listen_addresses=127.0.0.1 max_connections=300 synchronous_commit=on"
        )


async def test_postgres_left_running_is_adopted_by_a_new_handle(data_dir: Path) -> None:
    first = EmbeddedPostgres(data_dir / "pg").start()
    try:
        second = EmbeddedPostgres(data_dir / "pg").start()
        assert (second.pid, second.port) == (first.pid, first.port)
        assert await _fetchval(second.url_for("template1"), "SELECT 1") == 1

        second.stop()
        assert not first.running
        first.start()
        assert await _fetchval(first.url, "SELECT 2") == 2
    finally:
        first.stop()


async def test_redis_answers_again_after_a_crash_on_the_same_port(data_dir: Path) -> None:
    with EmbeddedRedis(data_dir / "redis") as server:
        port = server.port
        client = aioredis.from_url(server.url)
        try:
            await client.set("k", "v")
        finally:
            await client.aclose()
        assert await _redis_get(server.url, "k") == b"v"

        server.kill()
        assert not server.running
        assert not port_accepts_connections(port)

        server.restart()
        assert (server.port, server.running) == (port, True)
        assert await _redis_get(server.url, "k") is None  # no persistence: buckets start afresh


def test_redis_left_running_is_adopted_by_a_new_handle(data_dir: Path) -> None:
    with EmbeddedRedis(data_dir / "redis") as first:
        second = EmbeddedRedis(data_dir / "redis").start()
        assert (second.pid, second.port) == (first.pid, first.port)


def test_urls_come_from_the_environment_when_set(
    monkeypatch: pytest.MonkeyPatch, data_dir: Path
) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://u@db.example:5432/agentrun")
    monkeypatch.setenv("REDIS_URL", "redis://cache.example:6379/0")
    assert devstack.database_url(data_dir) == "postgresql://u@db.example:5432/agentrun"
    assert devstack.redis_url(data_dir) == "redis://cache.example:6379/0"
    assert list(data_dir.iterdir()) == []  # nothing was started


async def test_urls_start_embedded_servers_and_reuse_them(
    monkeypatch: pytest.MonkeyPatch, data_dir: Path
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("REDIS_URL", raising=False)
    try:
        url = devstack.database_url(data_dir)
        assert devstack.database_url(data_dir) == url
        assert await _fetchval(url, "SELECT 1") == 1
        assert devstack.redis_url(data_dir) == devstack.redis_url(data_dir)
    finally:
        EmbeddedPostgres(data_dir / "postgres").start().stop()
        EmbeddedRedis(data_dir / "redis").start().stop()
