"""The Redis the executors' rate limiter uses: REDIS_URL if set, else an embedded server."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agentrun_cli.devstack import EmbeddedRedis


@contextmanager
def redis_url() -> Iterator[str]:
    """REDIS_URL, or an embedded server (no persistence) for the duration of the block."""
    with redis_server() as (url, _):
        yield url


@contextmanager
def redis_server() -> Iterator[tuple[str, int | None]]:
    """As redis_url, with the server's pid when it is ours (for its CPU; None: REDIS_URL's)."""
    if url := os.environ.get("REDIS_URL"):
        yield url, None
        return
    tmp = Path(tempfile.mkdtemp(prefix="agentrun-bench-redis-"))
    server = EmbeddedRedis(tmp / "redis")
    try:
        server.start()
        pid = None
        with contextlib.suppress(OSError, ValueError):
            pid = int((tmp / "redis" / "redis.pid").read_text())
        yield server.url, pid
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
