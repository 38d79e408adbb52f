"""The Redis the executors' rate limiter uses: REDIS_URL if set, else an embedded server."""

from __future__ import annotations

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
    if url := os.environ.get("REDIS_URL"):
        yield url
        return
    tmp = Path(tempfile.mkdtemp(prefix="agentrun-bench-redis-"))
    server = EmbeddedRedis(tmp / "redis")
    try:
        server.start()
        yield server.url
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
