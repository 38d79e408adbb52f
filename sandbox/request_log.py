"""An in-memory, numbered log of the requests a sandbox server received."""

import time
from collections import deque
from typing import Any

# Benchmarks send many thousands of requests; keep the newest, never grow forever.
DEFAULT_CAPACITY = 100_000


class RequestLog:
    """Entries numbered from 1 in arrival order; `n` keeps counting across clears."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._entries: deque[dict[str, Any]] = deque(maxlen=capacity)
        self._next_n = 1

    def record(self, **fields: Any) -> dict[str, Any]:
        entry = {"n": self._next_n, "time": time.time(), **fields}
        self._next_n += 1
        self._entries.append(entry)
        return entry

    def entries(self) -> list[dict[str, Any]]:
        return list(self._entries)

    def clear(self) -> None:
        self._entries.clear()
