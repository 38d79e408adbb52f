"""What a test's captured log says went wrong: records carrying a traceback.

One kind is left out: asyncpg's "Failed to restore the pool connection floor" for a
database that does not exist. That is a pool another test left open on its database,
which was dropped at its teardown; the pool's background task keeps reconnecting in the
worker's shared event loop and logs into whichever test runs next (seen with files run
on two workers, where a worker's order differs from the serial one). The one found so
far was the server's own: `control_plane.server.start` left its pool open when a setting
failed after it was made (test_tls's unreadable key); it now closes it. The filter stays
for pools no search has found yet; a test's own database never disappears under it.
"""

from __future__ import annotations

import logging

import asyncpg


def _another_tests_dropped_database(record: logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    return record.name == "asyncpg.pool" and isinstance(
        error, asyncpg.exceptions.InvalidCatalogNameError
    )


def tracebacks(records: list[logging.LogRecord], width: int = 200) -> list[str]:
    """`logger: message` of every record with a traceback (in its exc_info or its text)."""
    return [
        f"{r.name}: {r.getMessage()[:width]}"
        for r in records
        if (r.exc_info or "Traceback" in r.getMessage()) and not _another_tests_dropped_database(r)
    ]
